/* Learning-rate schedules (ebb/schedule.h): each rate computed as
 * torch.optim.lr_scheduler's class computes it in torch 1.13, in the same
 * order of operations, from the previous rate where PyTorch's get_lr() is
 * recursive (step, multistep, exponential, linear, cosine) and from the
 * step count where it is a closed form (LambdaLR, OneCycleLR). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ebb/schedule.h"
#include "edit_distance.h"

/* math.pi: the double nearest pi */
#define PI 3.14159265358979323846

struct ebb_lr_scheduler {
    ebb_optimizer *opt;
    ebb_lr_schedule s;
    double base_lr; /* PyTorch's base_lrs[0] (initial_lr) */
    double lr;      /* the rate of the next optimizer step */
    int64_t last;   /* PyTorch's last_epoch: steps taken */
};

static const struct {
    const char *name;
    ebb_lr_schedule_kind kind;
    const char *form;
} kinds[] = {
    {"constant", EBB_LR_CONSTANT, "constant"},
    {"step", EBB_LR_STEP, "step:SIZE[:GAMMA]"},
    {"multistep", EBB_LR_MULTISTEP, "multistep:M1,M2,...[:GAMMA]"},
    {"exponential", EBB_LR_EXPONENTIAL, "exponential:GAMMA"},
    {"cosine", EBB_LR_COSINE, "cosine:T_MAX[:ETA_MIN]"},
    {"linear", EBB_LR_LINEAR, "linear:ITERS[:START[:END]]"},
    {"warmup-cosine", EBB_LR_WARMUP_COSINE, "warmup-cosine:WARMUP:TOTAL[:MIN_LR]"},
    {"onecycle", EBB_LR_ONE_CYCLE, "onecycle:MAX_LR:TOTAL[:PCT]"},
};
#define N_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

static const char *kind_form(ebb_lr_schedule_kind k) {
    for (int i = 0; i < N_KINDS; i++)
        if (kinds[i].kind == k)
            return kinds[i].form;
    return "?";
}

/* ---- the text form -------------------------------------------------------------- */

static ebb_status bad(const char *text, const char *form, const char *what) {
    return ebb_error_set(EBB_ERR_ARG, "learning-rate schedule '%s': %s (expected %s)", text, what,
                         form);
}

static int parse_count(const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < 0)
        return -1;
    *out = v;
    return 0;
}

static int parse_real(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

ebb_status ebb_lr_schedule_parse(ebb_lr_schedule *out, const char *text) {
    if (!out || !text)
        return ebb_error_set(EBB_ERR_ARG, "ebb_lr_schedule_parse: %s is NULL",
                             out ? "text" : "out");
    char buf[512];
    if (strlen(text) >= sizeof buf)
        return ebb_error_set(EBB_ERR_ARG, "learning-rate schedule '%.40s...': too long", text);
    snprintf(buf, sizeof buf, "%s", text);
    /* KIND:FIELD:FIELD..., at most 4 fields */
    char *field[5] = {buf};
    int n = 1;
    for (char *c = buf; *c; c++)
        if (*c == ':') {
            if (n == 5)
                break;
            *c = '\0';
            field[n++] = c + 1;
        }
    int k = -1;
    for (int i = 0; i < N_KINDS && k < 0; i++)
        if (strcmp(field[0], kinds[i].name) == 0)
            k = i;
    if (k < 0) {
        int best = -1, dist = 3;
        for (int i = 0; i < N_KINDS; i++) {
            int d = ebb_edit_distance(field[0], kinds[i].name, 2);
            if (d < dist) {
                dist = d;
                best = i;
            }
        }
        char list[256] = "";
        for (int i = 0; i < N_KINDS; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     kinds[i].name);
        if (best >= 0)
            return ebb_error_set(EBB_ERR_ARG,
                                 "learning-rate schedule '%s': unknown kind '%s'; did you mean "
                                 "'%s'? (%s)",
                                 text, field[0], kinds[best].name, kinds[best].form);
        return ebb_error_set(EBB_ERR_ARG, "learning-rate schedule '%s': unknown kind '%s' (one of "
                                          "%s)",
                             text, field[0], list);
    }
    const char *form = kinds[k].form;
    ebb_lr_schedule s = {.kind = kinds[k].kind};
    int args = n - 1;
    switch (s.kind) {
    case EBB_LR_CONSTANT:
        if (args)
            return bad(text, form, "takes no fields");
        break;
    case EBB_LR_STEP:
        s.gamma = 0.1;
        if (args < 1 || args > 2)
            return bad(text, form, "takes a step size and an optional gamma");
        if (parse_count(field[1], &s.step_size) || s.step_size < 1)
            return bad(text, form, "SIZE must be a whole number of steps >= 1");
        if (args == 2 && parse_real(field[2], &s.gamma))
            return bad(text, form, "GAMMA must be a number");
        break;
    case EBB_LR_MULTISTEP: {
        s.gamma = 0.1;
        if (args < 1 || args > 2)
            return bad(text, form, "takes milestones and an optional gamma");
        for (char *m = strtok(field[1], ","); m; m = strtok(NULL, ",")) {
            if (s.n_milestones == EBB_MAX_MILESTONES)
                return bad(text, form, "at most 16 milestones");
            if (parse_count(m, &s.milestones[s.n_milestones]))
                return bad(text, form, "a milestone must be a whole number of steps");
            s.n_milestones++;
        }
        if (!s.n_milestones)
            return bad(text, form, "no milestones");
        if (args == 2 && parse_real(field[2], &s.gamma))
            return bad(text, form, "GAMMA must be a number");
        break;
    }
    case EBB_LR_EXPONENTIAL:
        if (args != 1 || parse_real(field[1], &s.gamma))
            return bad(text, form, "takes one number, the factor per step");
        break;
    case EBB_LR_COSINE:
        if (args < 1 || args > 2)
            return bad(text, form, "takes T_MAX and an optional ETA_MIN");
        if (parse_count(field[1], &s.t_max) || s.t_max < 1)
            return bad(text, form, "T_MAX must be a whole number of steps >= 1");
        if (args == 2 && parse_real(field[2], &s.eta_min))
            return bad(text, form, "ETA_MIN must be a number");
        break;
    case EBB_LR_LINEAR:
        s.start_factor = 1.0 / 3;
        s.end_factor = 1.0;
        if (args < 1 || args > 3)
            return bad(text, form, "takes ITERS and optional start and end factors");
        if (parse_count(field[1], &s.total_iters))
            return bad(text, form, "ITERS must be a whole number of steps");
        if (args >= 2 && parse_real(field[2], &s.start_factor))
            return bad(text, form, "START must be a number");
        if (args == 3 && parse_real(field[3], &s.end_factor))
            return bad(text, form, "END must be a number");
        break;
    case EBB_LR_WARMUP_COSINE:
        if (args < 2 || args > 3 || parse_count(field[1], &s.warmup_steps) ||
            parse_count(field[2], &s.total_steps))
            return bad(text, form, "takes two whole numbers of steps and an optional floor rate");
        if (args == 3 && parse_real(field[3], &s.min_lr))
            return bad(text, form, "MIN_LR must be a number");
        break;
    case EBB_LR_ONE_CYCLE:
        s.pct_start = 0.3;
        if (args < 2 || args > 3 || parse_real(field[1], &s.max_lr) ||
            parse_count(field[2], &s.total_steps))
            return bad(text, form, "takes the peak rate and the total steps");
        if (args == 3 && parse_real(field[3], &s.pct_start))
            return bad(text, form, "PCT must be a number");
        break;
    }
    *out = s;
    return EBB_OK;
}

/* v in the fewest significant digits (15 to 17) that read back to it. */
static const char *num(char *buf, size_t size, double v) {
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

char *ebb_lr_schedule_str(const ebb_lr_schedule *s, char *buf, size_t size) {
    if (!buf || !size)
        return buf;
    buf[0] = '\0';
    if (!s)
        return buf;
    char a[32], b[32], c[32];
    switch (s->kind) {
    case EBB_LR_CONSTANT: snprintf(buf, size, "constant"); break;
    case EBB_LR_STEP:
        snprintf(buf, size, "step:%lld:%s", (long long)s->step_size, num(a, sizeof a, s->gamma));
        break;
    case EBB_LR_MULTISTEP: {
        int len = snprintf(buf, size, "multistep:");
        for (int i = 0; i < s->n_milestones && len > 0 && (size_t)len < size; i++)
            len += snprintf(buf + len, size - (size_t)len, "%s%lld", i ? "," : "",
                            (long long)s->milestones[i]);
        if (len > 0 && (size_t)len < size)
            snprintf(buf + len, size - (size_t)len, ":%s", num(a, sizeof a, s->gamma));
        break;
    }
    case EBB_LR_EXPONENTIAL: snprintf(buf, size, "exponential:%s", num(a, sizeof a, s->gamma)); break;
    case EBB_LR_COSINE:
        snprintf(buf, size, "cosine:%lld:%s", (long long)s->t_max, num(a, sizeof a, s->eta_min));
        break;
    case EBB_LR_LINEAR:
        snprintf(buf, size, "linear:%lld:%s:%s", (long long)s->total_iters,
                 num(a, sizeof a, s->start_factor), num(b, sizeof b, s->end_factor));
        break;
    case EBB_LR_WARMUP_COSINE:
        if (s->min_lr != 0)
            snprintf(buf, size, "warmup-cosine:%lld:%lld:%s", (long long)s->warmup_steps,
                     (long long)s->total_steps, num(a, sizeof a, s->min_lr));
        else
            snprintf(buf, size, "warmup-cosine:%lld:%lld", (long long)s->warmup_steps,
                     (long long)s->total_steps);
        break;
    case EBB_LR_ONE_CYCLE:
        snprintf(buf, size, "onecycle:%s:%lld:%s", num(a, sizeof a, s->max_lr),
                 (long long)s->total_steps, num(c, sizeof c, s->pct_start));
        break;
    }
    return buf;
}

/* ---- the rates -------------------------------------------------------------------- */

/* What PyTorch's constructor refuses, and what would make no sense here. */
static ebb_status check(const ebb_lr_schedule *s) {
    const char *form = kind_form(s->kind), *why = NULL;
    switch (s->kind) {
    case EBB_LR_CONSTANT: break;
    case EBB_LR_STEP:
        if (s->step_size < 1)
            why = "the step size must be >= 1";
        break;
    case EBB_LR_MULTISTEP:
        if (s->n_milestones < 1 || s->n_milestones > EBB_MAX_MILESTONES)
            why = "1 to 16 milestones";
        for (int i = 1; i < s->n_milestones && !why; i++)
            if (s->milestones[i] <= s->milestones[i - 1])
                why = "the milestones must increase";
        break;
    case EBB_LR_EXPONENTIAL: break;
    case EBB_LR_COSINE:
        if (s->t_max < 1)
            why = "T_MAX must be >= 1";
        break;
    case EBB_LR_LINEAR:
        if (!(s->start_factor > 0 && s->start_factor <= 1))
            why = "the start factor must be in (0, 1]";
        else if (!(s->end_factor >= 0 && s->end_factor <= 1))
            why = "the end factor must be in [0, 1]";
        else if (s->total_iters < 1)
            why = "ITERS must be >= 1";
        break;
    case EBB_LR_WARMUP_COSINE:
        if (s->total_steps < 1 || s->warmup_steps < 0 || s->warmup_steps > s->total_steps)
            why = "0 <= WARMUP <= TOTAL, and TOTAL >= 1";
        else if (!(s->min_lr >= 0) || !isfinite(s->min_lr))
            why = "MIN_LR must be >= 0";
        break;
    case EBB_LR_ONE_CYCLE:
        if (s->total_steps < 1)
            why = "TOTAL must be >= 1";
        else if (!(s->pct_start >= 0 && s->pct_start <= 1))
            why = "PCT must be in [0, 1]";
        else if (!(s->max_lr > 0) || !isfinite(s->max_lr))
            why = "the peak rate must be > 0";
        break;
    default: why = "unknown kind";
    }
    if (why)
        return ebb_error_set(EBB_ERR_ARG, "learning-rate schedule %s: %s", form, why);
    return EBB_OK;
}

/* transformers' get_cosine_schedule_with_warmup (num_cycles 0.5), as the
 * factor LambdaLR multiplies the base rate by. */
static double warmup_cosine_factor(const ebb_lr_schedule *s, int64_t t) {
    if (t < s->warmup_steps)
        return (double)t / (double)(s->warmup_steps > 1 ? s->warmup_steps : 1);
    int64_t rest = s->total_steps - s->warmup_steps;
    double progress = (double)(t - s->warmup_steps) / (double)(rest > 1 ? rest : 1);
    double f = 0.5 * (1.0 + cos(PI * 0.5 * 2.0 * progress));
    return f > 0.0 ? f : 0.0;
}

/* OneCycleLR's rate at step t (two phases, cosine annealing). */
static double one_cycle_lr(const ebb_lr_schedule *s, int64_t t) {
    double initial = s->max_lr / 25.0, peak = s->max_lr, final = initial / 1e4;
    double ends[2] = {s->pct_start * (double)s->total_steps - 1, (double)(s->total_steps - 1)};
    double starts_lr[2] = {initial, peak}, ends_lr[2] = {peak, final};
    double start_step = 0;
    for (int i = 0; i < 2; i++) {
        if ((double)t <= ends[i] || i == 1) {
            double pct = ((double)t - start_step) / (ends[i] - start_step);
            double cos_out = cos(PI * pct) + 1;
            return ends_lr[i] + (starts_lr[i] - ends_lr[i]) / 2.0 * cos_out;
        }
        start_step = ends[i];
    }
    return final;
}

/* The rate at step `last` from the rate `lr` of the step before (the
 * recursive forms) or from the base (the closed ones): PyTorch's get_lr(). */
static double next_lr(const ebb_lr_scheduler *r, double lr) {
    const ebb_lr_schedule *s = &r->s;
    int64_t t = r->last;
    switch (s->kind) {
    case EBB_LR_CONSTANT: return lr;
    case EBB_LR_STEP: return t == 0 || t % s->step_size != 0 ? lr : lr * s->gamma;
    case EBB_LR_MULTISTEP: {
        int hits = 0; /* PyTorch's Counter of milestones */
        for (int i = 0; i < s->n_milestones; i++)
            hits += s->milestones[i] == t;
        return hits ? lr * pow(s->gamma, hits) : lr;
    }
    case EBB_LR_EXPONENTIAL: return t == 0 ? lr : lr * s->gamma;
    case EBB_LR_COSINE: {
        double tm = (double)s->t_max;
        if (t == 0)
            return lr;
        if ((t - 1 - s->t_max) % (2 * s->t_max) == 0)
            return lr + (r->base_lr - s->eta_min) * (1 - cos(PI / tm)) / 2;
        return (1 + cos(PI * (double)t / tm)) / (1 + cos(PI * (double)(t - 1) / tm)) *
                   (lr - s->eta_min) +
               s->eta_min;
    }
    case EBB_LR_LINEAR:
        if (t == 0)
            return lr * s->start_factor;
        if (t > s->total_iters)
            return lr;
        return lr * (1. + (s->end_factor - s->start_factor) /
                              ((double)s->total_iters * s->start_factor +
                               (double)(t - 1) * (s->end_factor - s->start_factor)));
    case EBB_LR_WARMUP_COSINE:
        if (s->min_lr != 0 && t >= s->warmup_steps) {
            /* nanoGPT's get_lr: the cosine from the base rate down to
             * MIN_LR at TOTAL, and MIN_LR after */
            int64_t at = t < s->total_steps ? t : s->total_steps;
            double f = warmup_cosine_factor(s, at);
            return s->min_lr + f * (r->base_lr - s->min_lr);
        }
        return r->base_lr * warmup_cosine_factor(s, t);
    case EBB_LR_ONE_CYCLE: return one_cycle_lr(s, t);
    }
    return lr;
}

ebb_status ebb_lr_scheduler_new(ebb_lr_scheduler **out, ebb_optimizer *opt,
                                const ebb_lr_schedule *s) {
    if (!out)
        return ebb_error_set(EBB_ERR_ARG, "ebb_lr_scheduler_new: out is NULL");
    *out = NULL;
    if (!opt || !s)
        return ebb_error_set(EBB_ERR_ARG, "ebb_lr_scheduler_new: %s is NULL",
                             opt ? "the schedule" : "the optimizer");
    ebb_status st = check(s);
    if (st != EBB_OK)
        return st;
    ebb_lr_scheduler *r = calloc(1, sizeof *r);
    if (!r)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_lr_scheduler_new: out of memory");
    r->opt = opt;
    r->s = *s;
    /* OneCycleLR sets the group's initial_lr to max_lr / div_factor */
    r->base_lr = s->kind == EBB_LR_ONE_CYCLE ? s->max_lr / 25.0 : ebb_optimizer_get_options(opt).lr;
    r->last = 0; /* the constructor's step: last_epoch -1 -> 0 */
    r->lr = next_lr(r, r->base_lr);
    st = ebb_optimizer_set_lr(opt, r->lr);
    if (st != EBB_OK) {
        free(r);
        return ebb_error_prefix("ebb_lr_scheduler_new");
    }
    *out = r;
    return EBB_OK;
}

void ebb_lr_scheduler_free(ebb_lr_scheduler *s) { free(s); }

ebb_status ebb_lr_scheduler_step(ebb_lr_scheduler *r) {
    if (!r)
        return ebb_error_set(EBB_ERR_ARG, "ebb_lr_scheduler_step: the scheduler is NULL");
    if (r->s.kind == EBB_LR_ONE_CYCLE && r->last + 1 > r->s.total_steps)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_lr_scheduler_step: one-cycle schedule of %lld steps stepped "
                             "%lld times",
                             (long long)r->s.total_steps, (long long)r->last + 2);
    /* the rate PyTorch reads back is the optimizer's, which a caller may
     * have set between steps */
    double lr = ebb_optimizer_get_options(r->opt).lr;
    r->last++;
    double next = next_lr(r, lr);
    ebb_status st = ebb_optimizer_set_lr(r->opt, next);
    if (st != EBB_OK) {
        r->last--;
        return ebb_error_prefix("ebb_lr_scheduler_step: step %lld", (long long)r->last + 1);
    }
    r->lr = next;
    return EBB_OK;
}

double ebb_lr_scheduler_lr(const ebb_lr_scheduler *s) { return s ? s->lr : 0.0; }
int64_t ebb_lr_scheduler_steps(const ebb_lr_scheduler *s) { return s ? s->last : 0; }
double ebb_lr_scheduler_base_lr(const ebb_lr_scheduler *s) { return s ? s->base_lr : 0.0; }

ebb_status ebb_lr_scheduler_restore(ebb_lr_scheduler *r, int64_t steps, double lr,
                                    double base_lr) {
    if (!r)
        return ebb_error_set(EBB_ERR_ARG, "ebb_lr_scheduler_restore: the scheduler is NULL");
    if (steps < 0 || !isfinite(lr) || lr < 0 || !isfinite(base_lr) || base_lr < 0)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_lr_scheduler_restore: %lld steps at rate %g (base %g): the "
                             "count must be >= 0 and the rates finite and >= 0",
                             (long long)steps, lr, base_lr);
    ebb_status st = ebb_optimizer_set_lr(r->opt, lr);
    if (st != EBB_OK)
        return st;
    r->last = steps;
    r->lr = lr;
    r->base_lr = base_lr;
    return EBB_OK;
}
