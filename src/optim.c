/* Optimizers: per-parameter state beside a model's parameters, the update
 * kernels of the tensor layer (ops/tensor/optim.cpp) applied to it, and the
 * state saved and loaded under optim.* names. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ebb/optim.h"
#include "ebb/safetensors.h"
#include "edit_distance.h"
#include "internal.h"
#include "model_internal.h"
#include "run_internal.h"

enum {
    SLOT_MOMENTUM,
    SLOT_EXP_AVG,
    SLOT_EXP_AVG_SQ,
    SLOT_MAX_EXP_AVG_SQ,
    SLOT_SQUARE_AVG,
    SLOT_GRAD_AVG,
    SLOT_ACC_DELTA,
    SLOT_SUM,
    N_SLOTS
};
static const char *const slot_names[N_SLOTS] = {"momentum_buffer", "exp_avg",    "exp_avg_sq",
                                                "max_exp_avg_sq",  "square_avg", "grad_avg",
                                                "acc_delta",       "sum"};

/* optim.options: {version, kind, lr, momentum, dampening, nesterov,
 * weight_decay, beta1, beta2, eps, amsgrad} */
#define OPTIONS_NAME "optim.options"
#define OPTIONS_VERSION 2
#define OPTIONS_LEN 15
#define OPTIONS_LEN_V1 11

typedef struct param_state {
    ebb_tensor *slot[N_SLOTS];
    int64_t step;
    /* updated at least once (or loaded so): torch.optim's state[p] exists */
    int present;
} param_state;

struct ebb_optimizer {
    ebb_model *model;
    ebb_optimizer_options o; /* complete */
    int n;
    param_state *state;
    double *weight_decay; /* per parameter: o's, or its group's (ebb_optimizer_set_weight_decay) */
    double *lr_scale;     /* per parameter: its group's rate over o.lr (ebb_optimizer_set_lr_scale) */
    /* the device hyperparameters (run_internal.h): per parameter a row of
     * HYPER values in the parameters' dtype, on the device and on the host */
    ebb_tensor *hyper, *hyper_host;
    int hyper_on;
    ebb_loss_scaler scaler; /* GradScaler's state (src/loss_scale.c) */
    /* gradient accumulation (run_internal.h): per parameter its sum's
     * buffer, made at its first micro-batch and kept, and whether it holds
     * a gradient of this step */
    ebb_tensor **sums;
    unsigned char *summed;
};

ebb_loss_scaler *ebb_optimizer_scaler(ebb_optimizer *opt) { return &opt->scaler; }
const ebb_loss_scaler *ebb_optimizer_scaler_const(const ebb_optimizer *opt) {
    return &opt->scaler;
}

/* A hyperparameter row: Adam's -lr / (1 - beta1^t), sqrt(1 - beta2^t) and
 * AdamW's 1 - lr * weight_decay; SGD's -lr. */
enum { HYPER_STEP, HYPER_BC2, HYPER_DECAY, HYPER };

static const char *kind_name(ebb_optimizer_kind k) {
    switch (k) {
    case EBB_SGD:
        return "SGD";
    case EBB_ADAM:
        return "Adam";
    case EBB_ADAMW:
        return "AdamW";
    case EBB_RMSPROP:
        return "RMSprop";
    case EBB_ADAGRAD:
        return "Adagrad";
    case EBB_ADADELTA:
        return "Adadelta";
    }
    return "unknown";
}

static int is_adam(ebb_optimizer_kind k) { return k == EBB_ADAM || k == EBB_ADAMW; }

static int slot_used(const ebb_optimizer_options *o, int slot) {
    switch (slot) {
    case SLOT_MOMENTUM:
        return (o->kind == EBB_SGD || o->kind == EBB_RMSPROP) && o->momentum != 0;
    case SLOT_EXP_AVG:
    case SLOT_EXP_AVG_SQ:
        return is_adam(o->kind);
    case SLOT_MAX_EXP_AVG_SQ:
        return is_adam(o->kind) && o->amsgrad;
    case SLOT_SQUARE_AVG:
        return o->kind == EBB_RMSPROP || o->kind == EBB_ADADELTA;
    case SLOT_GRAD_AVG:
        return o->kind == EBB_RMSPROP && o->centered;
    case SLOT_ACC_DELTA:
        return o->kind == EBB_ADADELTA;
    case SLOT_SUM:
        return o->kind == EBB_ADAGRAD;
    }
    return 0;
}

const char *ebb_optimizer_state_slot(const ebb_optimizer_options *o, int k) {
    if (k < 0 || k >= N_SLOTS) return NULL;
    return !o || slot_used(o, k) ? slot_names[k] : "";
}

static int slots_used(const ebb_optimizer_options *o) {
    int n = 0;
    for (int s = 0; s < N_SLOTS; s++)
        n += slot_used(o, s);
    return n;
}

/* ---- options ----------------------------------------------------------------- */

static const char *const lower_names[] = {"sgd",     "adam",    "adamw",
                                          "rmsprop", "adagrad", "adadelta"};

const char *ebb_optimizer_kind_name(ebb_optimizer_kind kind) {
    return kind >= EBB_SGD && kind <= EBB_ADADELTA ? lower_names[kind] : "unknown";
}

ebb_status ebb_optimizer_kind_parse(ebb_optimizer_kind *out, const char *name) {
    int n = (int)(sizeof lower_names / sizeof lower_names[0]), best = -1, dist = 3;
    for (int k = 0; name && k < n; k++) {
        if (strcmp(name, lower_names[k]) == 0) {
            if (out) *out = (ebb_optimizer_kind)k;
            return EBB_OK;
        }
        int d = ebb_edit_distance(name, lower_names[k], 2);
        if (d < dist) {
            dist = d;
            best = k;
        }
    }
    if (best >= 0)
        return ebb_error_set(EBB_ERR_ARG, "unknown optimizer '%s'; did you mean '%s'? (sgd, adam, "
                                          "adamw, rmsprop, adagrad or adadelta)",
                             name, lower_names[best]);
    return ebb_error_set(EBB_ERR_ARG, "unknown optimizer '%s' (sgd, adam, adamw, rmsprop, adagrad "
                                      "or adadelta)",
                         name ? name : "(null)");
}

double ebb_optimizer_default_lr(ebb_optimizer_kind kind) {
    switch (kind) {
    case EBB_ADADELTA: return 1.0;
    case EBB_RMSPROP:
    case EBB_ADAGRAD: return 1e-2;
    case EBB_SGD: return 0.0;
    default: return 1e-3;
    }
}

ebb_optimizer_options ebb_optimizer_defaults(ebb_optimizer_kind kind, double lr) {
    ebb_optimizer_options o = {.kind = kind, .lr = lr, .complete = 1};
    if (kind == EBB_ADAM || kind == EBB_ADAMW) {
        o.beta1 = 0.9;
        o.beta2 = 0.999;
        o.eps = 1e-8;
        o.weight_decay = kind == EBB_ADAMW ? 1e-2 : 0.0;
    } else if (kind == EBB_RMSPROP) {
        o.rho = 0.99;
        o.eps = 1e-8;
    } else if (kind == EBB_ADAGRAD) {
        o.eps = 1e-10;
    } else if (kind == EBB_ADADELTA) {
        o.rho = 0.9;
        o.eps = 1e-6;
    }
    return o;
}

/* The checks torch.optim's constructors make (they raise ValueError), plus
 * finiteness (a NaN slips through their comparisons) and options of another
 * kind, which Python would refuse as an unexpected keyword. */
static ebb_status validate(const ebb_optimizer_options *o, const char *fn) {
    const struct {
        const char *name;
        double v;
    } f[] = {{"lr", o->lr},
             {"momentum", o->momentum},
             {"dampening", o->dampening},
             {"weight_decay", o->weight_decay},
             {"beta1", o->beta1},
             {"beta2", o->beta2},
             {"eps", o->eps},
             {"rho", o->rho},
             {"lr_decay", o->lr_decay},
             {"initial_accumulator_value", o->initial_accumulator_value}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!isfinite(f[i].v))
            return ebb_error_set(EBB_ERR_ARG, "%s: %s is %g; options must be finite", fn, f[i].name,
                                 f[i].v);
    if (o->lr < 0) return ebb_error_set(EBB_ERR_ARG, "%s: lr is %g; it must be >= 0", fn, o->lr);
    if (o->weight_decay < 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: weight_decay is %g; it must be >= 0", fn,
                             o->weight_decay);
    /* the fields each kind takes; the others must be 0 */
    const struct {
        const char *name;
        int set;
        unsigned kinds; /* bit k: kind k takes it */
    } fields[] = {
        {"momentum", o->momentum != 0, 1u << EBB_SGD | 1u << EBB_RMSPROP},
        {"dampening", o->dampening != 0, 1u << EBB_SGD},
        {"nesterov", o->nesterov != 0, 1u << EBB_SGD},
        {"beta1", o->beta1 != 0, 1u << EBB_ADAM | 1u << EBB_ADAMW},
        {"beta2", o->beta2 != 0, 1u << EBB_ADAM | 1u << EBB_ADAMW},
        {"eps", o->eps != 0, ~(1u << EBB_SGD)},
        {"amsgrad", o->amsgrad != 0, 1u << EBB_ADAM | 1u << EBB_ADAMW},
        {"rho", o->rho != 0, 1u << EBB_RMSPROP | 1u << EBB_ADADELTA},
        {"centered", o->centered != 0, 1u << EBB_RMSPROP},
        {"lr_decay", o->lr_decay != 0, 1u << EBB_ADAGRAD},
        {"initial_accumulator_value", o->initial_accumulator_value != 0, 1u << EBB_ADAGRAD},
    };
    /* SGD, Adam and AdamW name the others' fields below, as before these kinds */
    int old_kind = o->kind == EBB_SGD || is_adam(o->kind);
    for (size_t i = old_kind ? 7 : 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].set && !(fields[i].kinds >> o->kind & 1u))
            return ebb_error_set(EBB_ERR_ARG, "%s: %s is not an option of %s (leave it 0)", fn,
                                 fields[i].name, kind_name(o->kind));
    if (o->kind == EBB_RMSPROP || o->kind == EBB_ADAGRAD || o->kind == EBB_ADADELTA) {
        if (o->eps < 0)
            return ebb_error_set(EBB_ERR_ARG, "%s: eps is %g; it must be >= 0", fn, o->eps);
        if (o->momentum < 0)
            return ebb_error_set(EBB_ERR_ARG, "%s: momentum is %g; it must be >= 0", fn,
                                 o->momentum);
        if (o->rho < 0 || (o->kind == EBB_ADADELTA && o->rho > 1))
            return ebb_error_set(EBB_ERR_ARG, "%s: rho is %g; it must be %s", fn, o->rho,
                                 o->kind == EBB_ADADELTA ? "in [0, 1]" : ">= 0");
        if (o->lr_decay < 0)
            return ebb_error_set(EBB_ERR_ARG, "%s: lr_decay is %g; it must be >= 0", fn,
                                 o->lr_decay);
        if (o->initial_accumulator_value < 0)
            return ebb_error_set(EBB_ERR_ARG, "%s: initial_accumulator_value is %g; it must be "
                                              ">= 0",
                                 fn, o->initial_accumulator_value);
        return EBB_OK;
    }
    if (o->kind == EBB_SGD) {
        const char *foreign = o->beta1 != 0   ? "beta1"
                              : o->beta2 != 0 ? "beta2"
                              : o->eps != 0   ? "eps"
                              : o->amsgrad    ? "amsgrad"
                                              : NULL;
        if (foreign)
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: %s is an Adam and AdamW option; SGD has none (leave it 0)",
                                 fn, foreign);
        if (o->momentum < 0)
            return ebb_error_set(EBB_ERR_ARG, "%s: momentum is %g; it must be >= 0", fn,
                                 o->momentum);
        if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
            return ebb_error_set(
                EBB_ERR_ARG,
                "%s: nesterov needs momentum > 0 and dampening 0 (momentum is %g, dampening %g)",
                fn, o->momentum, o->dampening);
        return EBB_OK;
    }
    const char *foreign = o->momentum != 0    ? "momentum"
                          : o->dampening != 0 ? "dampening"
                          : o->nesterov       ? "nesterov"
                                              : NULL;
    if (foreign)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s is an SGD option; %s has none (leave it 0)", fn,
                             foreign, kind_name(o->kind));
    if (o->eps < 0) return ebb_error_set(EBB_ERR_ARG, "%s: eps is %g; it must be >= 0", fn, o->eps);
    if (o->beta1 < 0 || o->beta1 >= 1)
        return ebb_error_set(EBB_ERR_ARG, "%s: beta1 is %g; it must be in [0, 1)", fn, o->beta1);
    if (o->beta2 < 0 || o->beta2 >= 1)
        return ebb_error_set(EBB_ERR_ARG, "%s: beta2 is %g; it must be in [0, 1)", fn, o->beta2);
    return EBB_OK;
}

/* Fills torch.optim's defaults into the fields left at 0, unless the caller
 * said the options are complete. */
static ebb_status resolve(ebb_optimizer_options *out, const ebb_optimizer_options *in,
                          const char *fn) {
    if (in->kind < EBB_SGD || in->kind > EBB_ADADELTA)
        return ebb_error_set(EBB_ERR_ARG, "%s: unknown optimizer kind %d", fn, (int)in->kind);
    ebb_optimizer_options o = *in;
    if (!in->complete) {
        if (o.kind == EBB_SGD && o.lr == 0)
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: SGD has no default learning rate (torch.optim.SGD requires "
                                 "lr); set lr, or set complete for a learning rate of 0",
                                 fn);
        ebb_optimizer_options d = ebb_optimizer_defaults(o.kind, ebb_optimizer_default_lr(o.kind));
        if (o.lr == 0) o.lr = d.lr;
        if (o.weight_decay == 0) o.weight_decay = d.weight_decay;
        if (o.beta1 == 0) o.beta1 = d.beta1;
        if (o.beta2 == 0) o.beta2 = d.beta2;
        if (o.eps == 0) o.eps = d.eps;
        if (o.rho == 0) o.rho = d.rho;
    }
    o.nesterov = o.nesterov != 0;
    o.amsgrad = o.amsgrad != 0;
    o.centered = o.centered != 0;
    o.complete = 1;
    ebb_status st = validate(&o, fn);
    if (st == EBB_OK) *out = o;
    return st;
}

/* ---- lifetime ---------------------------------------------------------------- */

static void state_clear(param_state *s) {
    for (int k = 0; k < N_SLOTS; k++) {
        ebb_tensor_free(s->slot[k]);
        s->slot[k] = NULL;
    }
    s->step = 0;
    s->present = 0;
}

static int is_float(ebb_dtype dt) {
    return dt == EBB_FLOAT32 || dt == EBB_FLOAT64 || dt == EBB_FLOAT16 || dt == EBB_BFLOAT16;
}

static ebb_status make_state(ebb_optimizer *opt, int i, const char *fn);
static ebb_tensor *param_of(const ebb_optimizer *opt, int i);
static const char *param_name(const ebb_optimizer *opt, int i);

ebb_status ebb_optimizer_new(ebb_optimizer **out, ebb_model *model,
                             const ebb_optimizer_options *opts) {
    const char *fn = "ebb_optimizer_new";
    if (!out) return ebb_error_set(EBB_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!model || !opts)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s is NULL", fn, model ? "opts" : "model");
    ebb_optimizer_options o;
    ebb_status st = resolve(&o, opts, fn);
    if (st != EBB_OK) return st;
    /* integer tensors (batch_norm's num_batches_tracked) are counters, never
     * updated: ebb_optimizer_update() refuses them */
    ebb_optimizer *opt = calloc(1, sizeof *opt);
    if (opt) opt->state = calloc((size_t)model->n_params + 1, sizeof *opt->state);
    if (opt) opt->weight_decay = calloc((size_t)model->n_params + 1, sizeof *opt->weight_decay);
    if (opt) opt->lr_scale = calloc((size_t)model->n_params + 1, sizeof *opt->lr_scale);
    if (!opt || !opt->state || !opt->weight_decay || !opt->lr_scale) {
        if (opt) {
            free(opt->state);
            free(opt->weight_decay);
            free(opt->lr_scale);
        }
        free(opt);
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    }
    opt->model = model;
    opt->o = o;
    opt->n = model->n_params;
    for (int i = 0; i < opt->n; i++) {
        opt->weight_decay[i] = o.weight_decay;
        opt->lr_scale[i] = 1.0;
    }
    /* the state of every trained parameter (not a buffer) is made now, zeros, so
     * that no training step allocates it: a step's bytes are the same from
     * the first on, and the state is known beside the parameters before
     * anything runs (ebb_plan_optimizer_state_bytes) */
    for (int i = 0; st == EBB_OK && i < opt->n; i++)
        if (!model->buffer[i] && !model->frozen[i] && is_float(ebb_tensor_dtype(param_of(opt, i))))
            st = make_state(opt, i, fn);
    if (st != EBB_OK) {
        ebb_optimizer_free(opt);
        return st;
    }
    *out = opt;
    return EBB_OK;
}

void ebb_optimizer_free(ebb_optimizer *opt) {
    if (!opt) return;
    ebb_tensor_free(opt->hyper);
    ebb_tensor_free(opt->hyper_host);
    for (int i = 0; i < opt->n; i++)
        state_clear(&opt->state[i]);
    for (int i = 0; opt->sums && i < opt->n; i++)
        ebb_tensor_free(opt->sums[i]);
    free(opt->sums);
    free(opt->summed);
    free(opt->state);
    free(opt->weight_decay);
    free(opt->lr_scale);
    free(opt);
}

ebb_optimizer_options ebb_optimizer_get_options(const ebb_optimizer *opt) {
    ebb_optimizer_options none = {0};
    return opt ? opt->o : none;
}

ebb_status ebb_optimizer_set_lr(ebb_optimizer *opt, double lr) {
    if (!opt) return ebb_error_set(EBB_ERR_ARG, "ebb_optimizer_set_lr: opt is NULL");
    if (!isfinite(lr) || lr < 0)
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_optimizer_set_lr: lr is %g; it must be finite and >= 0", lr);
    opt->o.lr = lr;
    return EBB_OK;
}

ebb_status ebb_optimizer_set_weight_decay(ebb_optimizer *opt, int param_index, double wd) {
    const char *fn = "ebb_optimizer_set_weight_decay";
    if (!opt) return ebb_error_set(EBB_ERR_ARG, "%s: opt is NULL", fn);
    if (param_index < 0 || param_index >= opt->n)
        return ebb_error_set(EBB_ERR_ARG, "%s: parameter index %d is out of range (%d parameters)",
                             fn, param_index, opt->n);
    if (!isfinite(wd) || wd < 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: weight decay %g; it must be finite and >= 0", fn,
                             wd);
    opt->weight_decay[param_index] = wd;
    return EBB_OK;
}

double ebb_optimizer_get_weight_decay(const ebb_optimizer *opt, int param_index) {
    if (!opt || param_index < 0 || param_index >= opt->n) return 0;
    return opt->weight_decay[param_index];
}

ebb_status ebb_optimizer_set_lr_scale(ebb_optimizer *opt, int param_index, double scale) {
    const char *fn = "ebb_optimizer_set_lr_scale";
    if (!opt) return ebb_error_set(EBB_ERR_ARG, "%s: opt is NULL", fn);
    if (param_index < 0 || param_index >= opt->n)
        return ebb_error_set(EBB_ERR_ARG, "%s: parameter index %d is out of range (%d parameters)",
                             fn, param_index, opt->n);
    if (!isfinite(scale) || scale < 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: scale %g; it must be finite and >= 0", fn, scale);
    opt->lr_scale[param_index] = scale;
    return EBB_OK;
}

double ebb_optimizer_get_lr_scale(const ebb_optimizer *opt, int param_index) {
    if (!opt || param_index < 0 || param_index >= opt->n) return 0;
    return opt->lr_scale[param_index];
}

/* Parameter i's options: its group's weight decay and learning rate. */
static ebb_optimizer_options group_options(const ebb_optimizer *opt, int i) {
    ebb_optimizer_options o = opt->o;
    o.weight_decay = opt->weight_decay[i];
    o.lr *= opt->lr_scale[i];
    return o;
}

/* ---- updates ----------------------------------------------------------------- */

static ebb_tensor *param_of(const ebb_optimizer *opt, int i) {
    return opt->model->params[i];
}

static const char *param_name(const ebb_optimizer *opt, int i) {
    return opt->model->names[i];
}

/* The gradient must be exactly the parameter's shape, dtype and device:
 * checked here, with the parameter's name, before anything changes. */
static ebb_status check_grad(const ebb_optimizer *opt, int i, const ebb_tensor *grad,
                             const char *fn) {
    const ebb_tensor *p = param_of(opt, i);
    ebb_shape ps = ebb_tensor_shape(p), gs = ebb_tensor_shape(grad);
    ebb_dtype pd = ebb_tensor_dtype(p), gd = ebb_tensor_dtype(grad);
    char a[128], b[128];
    if (!is_float(pd))
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: parameter '%s' is %s, a counter; optimizers update "
                             "floating-point parameters only",
                             fn, opt->model->names[i], ebb_dtype_name(pd));
    if (opt->model->buffer[i])
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: parameter '%s' is a buffer (running statistics, no gradient); "
                             "optimizers update trained parameters only",
                             fn, opt->model->names[i]);
    if (!ebb_shape_equal(&ps, &gs) || ebb_tensor_ndim(p) != ebb_tensor_ndim(grad) || pd != gd)
        return ebb_error_set(
            EBB_ERR_SHAPE, "%s: parameter '%s': the gradient is %s %s, the parameter is %s %s", fn,
            param_name(opt, i), ebb_dtype_name(gd), ebb_shape_str(&gs, a, sizeof a),
            ebb_dtype_name(pd), ebb_shape_str(&ps, b, sizeof b));
    ebb_device pv = ebb_tensor_device(p), gv = ebb_tensor_device(grad);
    if (pv.type != gv.type || (pv.type == EBB_DEVICE_CUDA && pv.index != gv.index))
        return ebb_error_set(
            EBB_ERR_ARG, "%s: parameter '%s': the gradient is on %s, the parameter on %s", fn,
            param_name(opt, i), ebb_device_str(gv, a, sizeof a), ebb_device_str(pv, b, sizeof b));
    return EBB_OK;
}

/* Every state slot the options use, as zeros: made with the optimizer (and
 * for a parameter a loaded file held no state for). Adam's moments start so;
 * SGD's momentum buffer takes the gradient at the first update (see
 * run_kernel). */
static ebb_status zero_slots(param_state *s, const ebb_optimizer_options *o, const ebb_tensor *p,
                             const char *fn, const char *name) {
    ebb_shape shape = ebb_tensor_shape(p);
    for (int k = 0; k < N_SLOTS; k++) {
        if (!slot_used(o, k) || s->slot[k]) continue;
        /* Adagrad's sum starts at initial_accumulator_value, the rest at 0 */
        ebb_status st = k == SLOT_SUM
                            ? ebb_tensor_full(&s->slot[k], &shape, o->initial_accumulator_value,
                                              ebb_tensor_dtype(p), ebb_tensor_device(p))
                            : ebb_tensor_zeros(&s->slot[k], &shape, ebb_tensor_dtype(p),
                                               ebb_tensor_device(p));
        if (st != EBB_OK)
            return ebb_error_prefix("%s: parameter '%s': %s", fn, name, slot_names[k]);
    }
    return EBB_OK;
}

static ebb_status make_state(ebb_optimizer *opt, int i, const char *fn) {
    return zero_slots(&opt->state[i], &opt->o, param_of(opt, i), fn, param_name(opt, i));
}

static ebb_status run_kernel(ebb_optimizer *opt, int i, const ebb_tensor *grad, const char *fn) {
    param_state *s = &opt->state[i];
    ebb_tensor *p = param_of(opt, i);
    /* torch.optim's first SGD step with momentum starts the buffer as the
     * (decayed) gradient: the zeros made with the optimizer go first, and
     * the kernel makes it in their place, so the bytes held do not change */
    ebb_tensor *zeros = NULL;
    if (opt->o.kind == EBB_SGD && opt->o.momentum != 0 && !s->present) {
        zeros = s->slot[SLOT_MOMENTUM];
        s->slot[SLOT_MOMENTUM] = NULL;
        ebb_tensor_free(zeros);
    }
    ebb_tensor *hyper = NULL;
    ebb_status st = EBB_OK;
    if (opt->hyper_on)
        st = ebb_tensor_select(&hyper, opt->hyper, 0, i); /* a view: no device bytes */
    /* the parameter's group: its own weight decay and learning rate */
    ebb_optimizer_options o = group_options(opt, i);
    if (st == EBB_OK) {
        ebb_tensor **slot = s->slot;
        switch (o.kind) {
        case EBB_SGD:
            st = ebb_tensor_sgd_update_hyper_(p, grad, &slot[SLOT_MOMENTUM], &o, hyper);
            break;
        case EBB_RMSPROP:
            st = ebb_tensor_rmsprop_update_(p, grad, slot[SLOT_SQUARE_AVG], slot[SLOT_GRAD_AVG],
                                            slot[SLOT_MOMENTUM], &o, hyper);
            break;
        case EBB_ADAGRAD:
            st = ebb_tensor_adagrad_update_(p, grad, slot[SLOT_SUM], s->step + 1, &o, hyper);
            break;
        case EBB_ADADELTA:
            st = ebb_tensor_adadelta_update_(p, grad, slot[SLOT_SQUARE_AVG], slot[SLOT_ACC_DELTA],
                                             &o, hyper);
            break;
        default:
            st = ebb_tensor_adam_update_hyper_(p, grad, slot[SLOT_EXP_AVG], slot[SLOT_EXP_AVG_SQ],
                                               slot[SLOT_MAX_EXP_AVG_SQ], s->step + 1, &o, hyper);
        }
    }
    ebb_tensor_free(hyper);
    if (st != EBB_OK) {
        if (zeros && !s->slot[SLOT_MOMENTUM]) make_state(opt, i, fn); /* as it was, if it can */
        return ebb_error_prefix("%s: parameter '%s'", fn, param_name(opt, i));
    }
    s->step++;
    s->present = 1;
    return EBB_OK;
}

ebb_status ebb_optimizer_update(ebb_optimizer *opt, int param_index, const ebb_tensor *grad) {
    const char *fn = "ebb_optimizer_update";
    if (!opt || !grad)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s is NULL", fn, opt ? "grad" : "opt");
    if (param_index < 0 || param_index >= opt->n)
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: parameter index %d is out of range (the model has %d parameters)",
                             fn, param_index, opt->n);
    ebb_status st = check_grad(opt, param_index, grad, fn);
    if (st == EBB_OK) st = run_kernel(opt, param_index, grad, fn);
    return st;
}

ebb_status ebb_optimizer_step(ebb_optimizer *opt, ebb_tensor *const *grads) {
    const char *fn = "ebb_optimizer_step";
    if (!opt || !grads)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s is NULL", fn, opt ? "grads" : "opt");
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < opt->n; i++)
        if (grads[i]) st = check_grad(opt, i, grads[i], fn);
    for (int i = 0; st == EBB_OK && i < opt->n; i++)
        if (grads[i]) st = run_kernel(opt, i, grads[i], fn);
    return st;
}

/* ---- the device hyperparameters and snapshots (run_internal.h) ------------------ */

ebb_status ebb_optimizer_hyper_on(ebb_optimizer *opt, ebb_device device) {
    const char *fn = "ebb_optimizer_hyper_on";
    if (!opt->hyper) {
        ebb_dtype dt = EBB_FLOAT32;
        int first = 1;
        for (int i = 0; i < opt->n; i++) {
            if (!opt->state[i].slot[0] && !opt->state[i].present)
                continue; /* a buffer or counter: never updated */
            ebb_dtype pd = ebb_tensor_dtype(param_of(opt, i));
            if (!first && pd != dt)
                return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                     "%s: parameter '%s' is %s and others %s; a captured "
                                     "optimizer needs one dtype for all its parameters",
                                     fn, param_name(opt, i), ebb_dtype_name(pd),
                                     ebb_dtype_name(dt));
            dt = pd;
            first = 0;
        }
        ebb_shape sh = {2, {opt->n > 0 ? opt->n : 1, HYPER}};
        ebb_status st = ebb_tensor_zeros(&opt->hyper, &sh, dt, device);
        if (st == EBB_OK)
            st = ebb_tensor_zeros(&opt->hyper_host, &sh, EBB_FLOAT64, ebb_device_cpu());
        if (st != EBB_OK) {
            ebb_tensor_free(opt->hyper);
            opt->hyper = NULL;
            return st;
        }
    }
    opt->hyper_on = 1;
    return EBB_OK;
}

void ebb_optimizer_hyper_off(ebb_optimizer *opt) {
    if (opt)
        opt->hyper_on = 0;
}

/* Each parameter's row for its next update, computed in double precision
 * as the scalar kernels compute them, then one copy to the device. */
ebb_status ebb_optimizer_hyper_fill(ebb_optimizer *opt) {
    if (!opt->hyper)
        return ebb_error_set(EBB_ERR_ARG, "ebb_optimizer_hyper_fill: the device hyperparameters "
                                          "are off");
    size_t n = (size_t)(opt->n > 0 ? opt->n : 1) * HYPER;
    double *h = calloc(n, sizeof *h);
    if (!h)
        return ebb_error_set(EBB_ERR_NOMEM, "ebb_optimizer_hyper_fill: out of memory");
    for (int i = 0; i < opt->n; i++) {
        ebb_optimizer_options g = group_options(opt, i);
        const ebb_optimizer_options *o = &g;
        double *row = h + (size_t)i * HYPER, t = (double)(opt->state[i].step + 1);
        if (o->kind == EBB_ADAGRAD) { /* its step size decays with the step */
            row[HYPER_STEP] = -(o->lr / (1 + (t - 1) * o->lr_decay));
            row[HYPER_BC2] = row[HYPER_DECAY] = 1.0;
        } else if (!is_adam(o->kind)) {
            row[HYPER_STEP] = -o->lr;
            row[HYPER_BC2] = row[HYPER_DECAY] = 1.0;
        } else {
            row[HYPER_STEP] = -(o->lr / (1 - pow(o->beta1, t)));
            row[HYPER_BC2] = sqrt(1 - pow(o->beta2, t));
            row[HYPER_DECAY] = 1 - o->lr * o->weight_decay;
        }
    }
    ebb_status st = ebb_tensor_copy_from_host(opt->hyper_host, h, n * sizeof *h);
    free(h);
    return st == EBB_OK ? ebb_tensor_copy_(opt->hyper, opt->hyper_host) : st;
}

void ebb_optimizer_count_steps(ebb_optimizer *opt, const unsigned char *updated) {
    for (int i = 0; i < opt->n; i++)
        if (updated[i]) {
            opt->state[i].step++;
            opt->state[i].present = 1;
        }
}

struct ebb_train_snapshot {
    int n;
    ebb_tensor **params;           /* per parameter */
    ebb_tensor *(*slots)[N_SLOTS]; /* per parameter */
    int64_t *steps;
    int *present;
};

void ebb_train_snapshot_free(ebb_train_snapshot *s) {
    if (!s)
        return;
    for (int i = 0; i < s->n; i++) {
        ebb_tensor_free(s->params[i]);
        for (int k = 0; s->slots && k < N_SLOTS; k++)
            ebb_tensor_free(s->slots[i][k]);
    }
    free(s->params);
    free(s->slots);
    free(s->steps);
    free(s->present);
    free(s);
}

ebb_status ebb_train_snapshot_new(ebb_train_snapshot **out, ebb_model *model,
                                  const ebb_optimizer *opt) {
    *out = NULL;
    ebb_train_snapshot *s = calloc(1, sizeof *s);
    size_t n = (size_t)model->n_params + 1;
    if (s) {
        s->n = model->n_params;
        s->params = calloc(n, sizeof *s->params);
        s->slots = calloc(n, sizeof *s->slots);
        s->steps = calloc(n, sizeof *s->steps);
        s->present = calloc(n, sizeof *s->present);
    }
    if (!s || !s->params || !s->slots || !s->steps || !s->present) {
        ebb_train_snapshot_free(s);
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    }
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < s->n; i++) {
        st = ebb_tensor_clone(&s->params[i], model->params[i]);
        for (int k = 0; st == EBB_OK && k < N_SLOTS; k++)
            if (opt->state[i].slot[k])
                st = ebb_tensor_clone(&s->slots[i][k], opt->state[i].slot[k]);
        s->steps[i] = opt->state[i].step;
        s->present[i] = opt->state[i].present;
    }
    if (st != EBB_OK) {
        ebb_train_snapshot_free(s);
        return st;
    }
    *out = s;
    return EBB_OK;
}

ebb_status ebb_train_snapshot_restore_counts(const ebb_train_snapshot *s, ebb_optimizer *opt) {
    for (int i = 0; i < s->n; i++) {
        opt->state[i].step = s->steps[i];
        opt->state[i].present = s->present[i];
    }
    return EBB_OK;
}

int64_t ebb_train_snapshot_step_count(const ebb_train_snapshot *s, int i) {
    return s->steps[i];
}

/* SGD with momentum makes its buffer at a parameter's first update (as
 * torch.optim does): inside a graph that buffer would come from the
 * graph's own memory pool, which later replays reuse. */
void ebb_optimizer_drop_state(ebb_optimizer *opt, int i) {
    if (opt && i >= 0 && i < opt->n)
        state_clear(&opt->state[i]);
}

ebb_status ebb_optimizer_check_capturable(const ebb_optimizer *opt, const char *fn) {
    if (opt->o.kind != EBB_SGD || opt->o.momentum == 0)
        return EBB_OK;
    for (int i = 0; i < opt->n; i++)
        if (opt->state[i].slot[SLOT_MOMENTUM] && !opt->state[i].present)
            return ebb_error_set(EBB_ERR_UNSUPPORTED,
                                 "%s: SGD with momentum makes parameter '%s''s buffer at its "
                                 "first update, which a CUDA graph cannot hold: run one "
                                 "ebb_train_step() before capturing",
                                 fn, param_name(opt, i));
    return EBB_OK;
}

/* Copies the values back into the same tensors: a CUDA graph keeps their
 * addresses. */
ebb_status ebb_train_snapshot_restore(const ebb_train_snapshot *s, ebb_model *model,
                                      ebb_optimizer *opt) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < s->n; i++) {
        st = ebb_tensor_copy_(model->params[i], s->params[i]);
        for (int k = 0; st == EBB_OK && k < N_SLOTS; k++)
            if (s->slots[i][k] && opt->state[i].slot[k])
                st = ebb_tensor_copy_(opt->state[i].slot[k], s->slots[i][k]);
        opt->state[i].step = s->steps[i];
        opt->state[i].present = s->present[i];
    }
    return st;
}

int64_t ebb_optimizer_step_count(const ebb_optimizer *opt) {
    int64_t most = 0;
    for (int i = 0; opt && i < opt->n; i++)
        if (opt->state[i].step > most) most = opt->state[i].step;
    return most;
}

int64_t ebb_optimizer_param_step_count(const ebb_optimizer *opt, int param_index) {
    if (!opt || param_index < 0 || param_index >= opt->n) return -1;
    return opt->state[param_index].step;
}

int64_t ebb_optimizer_state_bytes(const ebb_optimizer *opt, int64_t *most) {
    int64_t now = 0, all = 0;
    for (int i = 0; opt && i < opt->n; i++) {
        for (int k = 0; k < N_SLOTS; k++)
            if (opt->state[i].slot[k]) now += (int64_t)ebb_tensor_nbytes(opt->state[i].slot[k]);
        if (!opt->model->buffer[i] && is_float(ebb_tensor_dtype(param_of(opt, i))))
            all += (int64_t)ebb_tensor_nbytes(param_of(opt, i)) * slots_used(&opt->o);
    }
    if (most) *most = all;
    return now;
}

/* ---- gradient accumulation's sums ---- */

void ebb_optimizer_sums_restart(ebb_optimizer *opt) {
    if (opt && opt->summed) memset(opt->summed, 0, (size_t)opt->n);
}

/* Parameter i's sum made, zeros of the parameter's shape and dtype (the
 * gradient's), its bytes into *made. */
static ebb_status sum_buffer(ebb_optimizer *opt, int i, int64_t *made) {
    if (!opt->sums) {
        opt->sums = calloc((size_t)opt->n + 1, sizeof *opt->sums);
        opt->summed = calloc((size_t)opt->n + 1, 1);
        if (!opt->sums || !opt->summed) {
            free(opt->sums);
            free(opt->summed);
            opt->sums = NULL;
            opt->summed = NULL;
            return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
        }
    }
    if (opt->sums[i]) return EBB_OK;
    const ebb_tensor *p = param_of(opt, i);
    ebb_shape sh = ebb_tensor_shape(p);
    ebb_status st = ebb_tensor_zeros(&opt->sums[i], &sh, ebb_tensor_dtype(p), ebb_tensor_device(p));
    if (st == EBB_OK) *made += (int64_t)ebb_tensor_nbytes(opt->sums[i]);
    return st;
}

ebb_status ebb_optimizer_sum_add(ebb_optimizer *opt, int i, const ebb_tensor *g, int64_t *made) {
    if (!opt || i < 0 || i >= opt->n || !g)
        return ebb_error_set(EBB_ERR_ARG, "ebb_optimizer_sum_add: no parameter %d", i);
    ebb_status st = sum_buffer(opt, i, made);
    if (st != EBB_OK) return st;
    /* the step's first gradient is copied, as PyTorch assigns .grad, so
     * that the sum is bit for bit what one backward gave */
    st = opt->summed[i] ? ebb_tensor_add_(opt->sums[i], g) : ebb_tensor_copy_(opt->sums[i], g);
    if (st == EBB_OK) opt->summed[i] = 1;
    return st;
}

ebb_status ebb_optimizer_sum_zeros(ebb_optimizer *opt, int i, int64_t *made) {
    if (!opt || i < 0 || i >= opt->n)
        return ebb_error_set(EBB_ERR_ARG, "ebb_optimizer_sum_zeros: no parameter %d", i);
    if (opt->summed && opt->summed[i]) return EBB_OK;
    /* made again rather than scaled by 0, which keeps a stale NaN; the old
     * buffer goes first, so that the bytes held do not change */
    if (opt->sums && opt->sums[i]) {
        *made -= (int64_t)ebb_tensor_nbytes(opt->sums[i]);
        ebb_tensor_free(opt->sums[i]);
        opt->sums[i] = NULL;
    }
    ebb_status st = sum_buffer(opt, i, made);
    if (st == EBB_OK) opt->summed[i] = 1;
    return st;
}

ebb_tensor *ebb_optimizer_sum(const ebb_optimizer *opt, int i) {
    if (!opt || !opt->sums || i < 0 || i >= opt->n || !opt->summed[i]) return NULL;
    return opt->sums[i];
}

int64_t ebb_optimizer_sums_bytes(const ebb_optimizer *opt) {
    int64_t n = 0;
    for (int i = 0; opt && opt->sums && i < opt->n; i++)
        if (opt->sums[i]) n += (int64_t)ebb_tensor_nbytes(opt->sums[i]);
    return n;
}

/* The kernels' own allocations are described beside them
 * (ops/tensor/optim.cpp). */
int64_t ebb_optimizer_scratch_bytes(const ebb_optimizer *opt, int param_index) {
    if (!opt || param_index < 0 || param_index >= opt->n) return -1;
    const ebb_tensor *p = param_of(opt, param_index);
    int has_state = opt->o.kind != EBB_SGD || opt->o.momentum == 0 ||
                    opt->state[param_index].present;
    ebb_optimizer_options o = group_options(opt, param_index);
    return ebb_optimizer_update_scratch_bytes(&o, ebb_tensor_dtype(p), ebb_tensor_numel(p),
                                              ebb_tensor_device(p), has_state);
}

ebb_tensor *ebb_optimizer_state_tensor(const ebb_optimizer *opt, int param_index,
                                       const char *which) {
    if (!opt || !which || param_index < 0 || param_index >= opt->n) return NULL;
    for (int k = 0; k < N_SLOTS; k++)
        if (strcmp(which, slot_names[k]) == 0) return opt->state[param_index].slot[k];
    return NULL;
}

/* ---- saving and loading --------------------------------------------------------- */

static char *state_name(const char *param, const char *what) {
    size_t n = strlen("optim.") + strlen(param) + 1 + strlen(what) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "optim.%s.%s", param, what);
    return s;
}

static ebb_status options_tensor(ebb_tensor **out, const ebb_optimizer_options *o) {
    double v[OPTIONS_LEN] = {OPTIONS_VERSION, (double)o->kind, o->lr,
                             o->momentum,     o->dampening,    o->nesterov,
                             o->weight_decay, o->beta1,        o->beta2,
                             o->eps,          o->amsgrad,      o->rho,
                             o->centered,     o->lr_decay,     o->initial_accumulator_value};
    ebb_shape shape = {1, {OPTIONS_LEN}};
    return ebb_tensor_from_host(out, v, sizeof v, &shape, EBB_FLOAT64, ebb_device_cpu());
}

ebb_status ebb_optimizer_save(const ebb_optimizer *opt, const char *path) {
    const char *fn = "ebb_optimizer_save";
    if (!opt || !path)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s is NULL", fn, opt ? "path" : "opt");
    int cap = 2 + opt->n * (N_SLOTS + 1), n = 0;
    char **names = calloc((size_t)cap, sizeof *names);
    ebb_tensor **ts = calloc((size_t)cap, sizeof *ts);
    /* which entries are handles made here (the options and the steps) */
    char *made = calloc((size_t)cap, 1);
    ebb_status st =
        names && ts && made ? EBB_OK : ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    if (st == EBB_OK) {
        names[n] = malloc(sizeof OPTIONS_NAME);
        if (names[n]) memcpy(names[n], OPTIONS_NAME, sizeof OPTIONS_NAME);
        made[n] = 1;
        st = names[n] ? options_tensor(&ts[n], &opt->o)
                      : ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
        n++;
    }
    for (int i = 0; st == EBB_OK && i < opt->n; i++) {
        const param_state *s = &opt->state[i];
        if (!s->present) continue;
        for (int k = 0; st == EBB_OK && k <= N_SLOTS; k++) {
            int is_step = k == N_SLOTS;
            if (!is_step && !s->slot[k]) continue;
            names[n] = state_name(param_name(opt, i), is_step ? "step" : slot_names[k]);
            made[n] = (char)is_step;
            if (!names[n]) {
                st = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
            } else if (is_step) {
                ebb_shape scalar = {0, {0}};
                st = ebb_tensor_full(&ts[n], &scalar, (double)s->step, EBB_FLOAT64,
                                     ebb_device_cpu());
            } else {
                ts[n] = s->slot[k];
            }
            n++;
        }
    }
    if (st == EBB_OK && opt->scaler.on) {
        names[n] = malloc(sizeof EBB_SCALER_NAME);
        if (names[n]) memcpy(names[n], EBB_SCALER_NAME, sizeof EBB_SCALER_NAME);
        made[n] = 1;
        st = names[n] ? ebb_loss_scaler_tensor(&ts[n], &opt->scaler)
                      : ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
        n++;
    }
    if (st == EBB_OK) st = ebb_safetensors_write(path, (const char *const *)names, ts, n);
    for (int j = 0; j < n; j++) {
        free(names[j]);
        if (made[j]) ebb_tensor_free(ts[j]);
    }
    free(names);
    free(ts);
    free(made);
    return st;
}

/* Non-zero when the file has a tensor of that name, in any dtype. */
static int has_tensor(const ebb_safetensors *st, const char *name) {
    return ebb_safetensors_find(st, name, NULL, NULL) != EBB_ERR_ARG;
}

/* Reads and checks optim.options into *o (complete). */
static ebb_status load_options(const ebb_safetensors *st, const ebb_optimizer *opt,
                               ebb_optimizer_options *o, const char *fn, const char *path) {
    ebb_dtype dt = EBB_FLOAT64;
    ebb_shape shape = {0, {0}};
    char buf[96];
    ebb_status f = ebb_safetensors_find(st, OPTIONS_NAME, &dt, &shape);
    if (f == EBB_ERR_ARG)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s: no '%s' tensor (not an optimizer state file?)",
                             fn, path, OPTIONS_NAME);
    if (f != EBB_OK) return ebb_error_prefix("%s: %s", fn, path);
    /* version 2 has OPTIONS_LEN values, version 1 the first OPTIONS_LEN_V1 */
    if (dt != EBB_FLOAT64 || shape.ndim != 1 ||
        (shape.dim[0] != OPTIONS_LEN && shape.dim[0] != OPTIONS_LEN_V1))
        return ebb_error_set(EBB_ERR_SHAPE, "%s: %s: '%s' is %s %s; expected float64 [%d]", fn,
                             path, OPTIONS_NAME, ebb_dtype_name(dt),
                             ebb_shape_str(&shape, buf, sizeof buf), OPTIONS_LEN);
    ebb_tensor *t = NULL;
    double v[OPTIONS_LEN] = {0};
    int len = (int)shape.dim[0];
    ebb_status s = ebb_safetensors_load(&t, st, OPTIONS_NAME, ebb_device_cpu());
    if (s == EBB_OK) s = ebb_tensor_to_host(t, v, (size_t)len * sizeof v[0]);
    ebb_tensor_free(t);
    if (s != EBB_OK) return ebb_error_prefix("%s", fn);
    if (v[0] != (len == OPTIONS_LEN ? OPTIONS_VERSION : 1))
        return ebb_error_set(EBB_ERR_ARG,
                             "%s: %s: '%s' has format version %g in %d values; this ebb reads "
                             "version 1 (11 values) and %d (%d)",
                             fn, path, OPTIONS_NAME, v[0], len, OPTIONS_VERSION, OPTIONS_LEN);
    if (v[1] != (double)opt->o.kind)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s: the file holds %s state; this optimizer is %s",
                             fn, path,
                             v[1] >= EBB_SGD && v[1] <= EBB_ADADELTA && v[1] == (int)v[1]
                                 ? kind_name((ebb_optimizer_kind)v[1])
                                 : "unknown",
                             kind_name(opt->o.kind));
    *o = (ebb_optimizer_options){.kind = opt->o.kind,
                                 .lr = v[2],
                                 .momentum = v[3],
                                 .dampening = v[4],
                                 .nesterov = v[5] != 0,
                                 .weight_decay = v[6],
                                 .beta1 = v[7],
                                 .beta2 = v[8],
                                 .eps = v[9],
                                 .amsgrad = v[10] != 0,
                                 .rho = v[11],
                                 .centered = v[12] != 0,
                                 .lr_decay = v[13],
                                 .initial_accumulator_value = v[14],
                                 .complete = 1};
    if (validate(o, fn) != EBB_OK) return ebb_error_prefix("%s: '%s'", path, OPTIONS_NAME);
    return EBB_OK;
}

/* Checks that a state tensor in the file is its parameter's dtype and shape. */
static ebb_status check_slot(const ebb_safetensors *st, const char *name, const ebb_tensor *p,
                             const char *fn, const char *path) {
    ebb_dtype dt, want = ebb_tensor_dtype(p);
    ebb_shape shape, ps = ebb_tensor_shape(p);
    char a[96], b[96];
    /* the reader's message names the tensor and a dtype ebb has no tensors of */
    if (ebb_safetensors_find(st, name, &dt, &shape) != EBB_OK)
        return ebb_error_prefix("%s: %s", fn, path);
    if (dt != want || !ebb_shape_equal(&shape, &ps))
        return ebb_error_set(EBB_ERR_SHAPE,
                             "%s: %s: '%s' is %s %s in the file, the parameter is %s %s", fn, path,
                             name, ebb_dtype_name(dt), ebb_shape_str(&shape, a, sizeof a),
                             ebb_dtype_name(want), ebb_shape_str(&ps, b, sizeof b));
    return EBB_OK;
}

/* Reads a step count: a scalar holding a non-negative whole number. */
static ebb_status load_step(const ebb_safetensors *st, const char *name, int64_t *out,
                            const char *fn, const char *path) {
    ebb_dtype dt = EBB_FLOAT64;
    ebb_shape shape = {0, {0}};
    char a[96];
    if (ebb_safetensors_find(st, name, &dt, &shape) != EBB_OK)
        return ebb_error_prefix("%s: %s", fn, path);
    if (shape.ndim != 0 ||
        !(dt == EBB_FLOAT64 || dt == EBB_FLOAT32 || dt == EBB_INT64 || dt == EBB_INT32))
        return ebb_error_set(EBB_ERR_SHAPE,
                             "%s: %s: '%s' is %s %s; a step is a scalar ([]) of float64, float32, "
                             "int64 or int32",
                             fn, path, name, ebb_dtype_name(dt),
                             ebb_shape_str(&shape, a, sizeof a));
    ebb_tensor *t = NULL;
    double v = 0;
    ebb_status s = ebb_safetensors_load(&t, st, name, ebb_device_cpu());
    if (s == EBB_OK) s = ebb_tensor_item(t, &v);
    ebb_tensor_free(t);
    if (s != EBB_OK) return ebb_error_prefix("%s", fn);
    if (!(v >= 0 && v <= 9007199254740992.0 && v == floor(v)))
        return ebb_error_set(EBB_ERR_ARG, "%s: %s: '%s' is %g; a step is a whole number >= 0", fn,
                             path, name, v);
    *out = (int64_t)v;
    return EBB_OK;
}

/* An optim.* name must be the options or a state entry that some parameter
 * has under the file's options. */
static ebb_status check_name(const ebb_optimizer *opt, const ebb_optimizer_options *o,
                             const char *name, const char *fn, const char *path) {
    if (strcmp(name, OPTIONS_NAME) == 0 || strcmp(name, EBB_SCALER_NAME) == 0) return EBB_OK;
    const char *rest = name + strlen("optim.");
    const char *dot = strrchr(rest, '.');
    if (dot && dot > rest) {
        const char *what = dot + 1;
        int known = strcmp(what, "step") == 0;
        for (int k = 0; !known && k < N_SLOTS; k++)
            known = slot_used(o, k) && strcmp(what, slot_names[k]) == 0;
        for (int i = 0; known && i < opt->n; i++) {
            const char *pn = param_name(opt, i);
            if (strlen(pn) == (size_t)(dot - rest) && strncmp(pn, rest, (size_t)(dot - rest)) == 0)
                return EBB_OK;
        }
    }
    return ebb_error_set(EBB_ERR_ARG,
                         "%s: %s: unexpected tensor '%s' (the model has no such parameter, or %s "
                         "keeps no such state)",
                         fn, path, name, kind_name(o->kind));
}

ebb_status ebb_optimizer_load(ebb_optimizer *opt, const char *path) {
    const char *fn = "ebb_optimizer_load";
    if (!opt || !path)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s is NULL", fn, opt ? "path" : "opt");
    ebb_safetensors *st = NULL;
    ebb_status s = ebb_safetensors_open(&st, path);
    if (s != EBB_OK) return s;
    ebb_optimizer_options o;
    s = load_options(st, opt, &o, fn, path);

    /* Every name is checked, then every tensor read into new state; the
     * optimizer's own state is replaced only when all of that succeeded. */
    for (int i = 0; s == EBB_OK && i < ebb_safetensors_count(st); i++) {
        const char *name = ebb_safetensors_name_at(st, i);
        if (strncmp(name, "optim.", 6) == 0) s = check_name(opt, &o, name, fn, path);
    }
    /* the loss scaler's state, when the file has one; else the
     * optimizer's own stays */
    ebb_loss_scaler scaler = opt->scaler;
    if (s == EBB_OK && has_tensor(st, EBB_SCALER_NAME)) {
        ebb_tensor *t = NULL;
        s = ebb_safetensors_load(&t, st, EBB_SCALER_NAME, ebb_device_cpu());
        if (s == EBB_OK) s = ebb_loss_scaler_from(&scaler, t, fn, path);
        scaler.skips = opt->scaler.skips;
        ebb_tensor_free(t);
    }
    param_state *fresh = s == EBB_OK ? calloc((size_t)opt->n + 1, sizeof *fresh) : NULL;
    if (s == EBB_OK && !fresh) s = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    for (int i = 0; s == EBB_OK && i < opt->n; i++) {
        const ebb_tensor *p = param_of(opt, i);
        char *names[N_SLOTS + 1] = {0};
        int want = 0, have = 0, missing = -1, found = -1;
        for (int k = 0; k <= N_SLOTS; k++) {
            if (k < N_SLOTS && !slot_used(&o, k)) continue;
            names[k] = state_name(param_name(opt, i), k < N_SLOTS ? slot_names[k] : "step");
            if (!names[k]) {
                s = ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
                break;
            }
            want++;
            if (has_tensor(st, names[k])) {
                have++;
                found = k;
            } else {
                missing = k;
            }
        }
        if (s == EBB_OK && have > 0 && have < want)
            s = ebb_error_set(EBB_ERR_ARG, "%s: %s: '%s' is missing (the file has '%s')", fn, path,
                              names[missing], names[found]);
        for (int k = 0; s == EBB_OK && have > 0 && k < N_SLOTS; k++)
            if (names[k]) s = check_slot(st, names[k], p, fn, path);
        if (s == EBB_OK && have > 0) s = load_step(st, names[N_SLOTS], &fresh[i].step, fn, path);
        for (int k = 0; s == EBB_OK && have > 0 && k < N_SLOTS; k++)
            if (names[k]) {
                s = ebb_safetensors_load(&fresh[i].slot[k], st, names[k], ebb_tensor_device(p));
                if (s != EBB_OK) ebb_error_prefix("%s", fn);
            }
        fresh[i].present = have > 0;
        /* a parameter the file holds no state for starts from zeros, as
         * one the optimizer was made with */
        if (s == EBB_OK && !have && !opt->model->buffer[i] && is_float(ebb_tensor_dtype(p)))
            s = zero_slots(&fresh[i], &o, p, fn, param_name(opt, i));
        for (int k = 0; k <= N_SLOTS; k++)
            free(names[k]);
    }
    ebb_safetensors_close(st);
    if (s != EBB_OK) {
        for (int i = 0; fresh && i < opt->n; i++)
            state_clear(&fresh[i]);
        free(fresh);
        return s;
    }
    for (int i = 0; i < opt->n; i++)
        state_clear(&opt->state[i]);
    free(opt->state);
    opt->state = fresh;
    /* parameters that followed the options' weight decay follow the file's;
     * a group's own (ebb_optimizer_set_weight_decay) stays */
    for (int i = 0; i < opt->n; i++)
        if (opt->weight_decay[i] == opt->o.weight_decay)
            opt->weight_decay[i] = o.weight_decay;
    opt->o = o;
    opt->scaler = scaler;
    return EBB_OK;
}

/* ---- loss scaling's state: its options checked, its tensor ------------------------- */

#define SCALER_VERSION 1
#define SCALER_LEN 6

ebb_status ebb_loss_scaling_check(const ebb_loss_scaling *o, const char *fn) {
    if (!(isfinite(o->init_scale) && o->init_scale > 0 && o->init_scale <= FLT_MAX))
        return ebb_error_set(EBB_ERR_ARG, "%s: init_scale %g must be positive and finite in float32",
                             fn, o->init_scale);
    if (!(isfinite(o->growth_factor) && o->growth_factor > 1))
        return ebb_error_set(EBB_ERR_ARG, "%s: growth_factor %g must be above 1", fn,
                             o->growth_factor);
    if (!(o->backoff_factor > 0 && o->backoff_factor < 1))
        return ebb_error_set(EBB_ERR_ARG, "%s: backoff_factor %g must be in (0, 1)", fn,
                             o->backoff_factor);
    if (o->growth_interval <= 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: growth_interval %d must be positive", fn,
                             o->growth_interval);
    return EBB_OK;
}

ebb_status ebb_loss_scaler_tensor(ebb_tensor **out, const ebb_loss_scaler *s) {
    double v[SCALER_LEN] = {SCALER_VERSION, s->scale,    s->growth,
                            s->backoff,     s->interval, s->tracker};
    ebb_shape shape = {1, {SCALER_LEN}};
    return ebb_tensor_from_host(out, v, sizeof v, &shape, EBB_FLOAT64, ebb_device_cpu());
}

ebb_status ebb_loss_scaler_from(ebb_loss_scaler *out, const ebb_tensor *t, const char *fn,
                                const char *path) {
    ebb_shape shape = ebb_tensor_shape(t);
    char buf[64];
    if (ebb_tensor_dtype(t) != EBB_FLOAT64 || shape.ndim != 1 || shape.dim[0] != SCALER_LEN)
        return ebb_error_set(EBB_ERR_SHAPE, "%s: %s: '%s' is %s %s; expected float64 [%d]", fn,
                             path, EBB_SCALER_NAME, ebb_dtype_name(ebb_tensor_dtype(t)),
                             ebb_shape_str(&shape, buf, sizeof buf), SCALER_LEN);
    double v[SCALER_LEN];
    ebb_status st = ebb_tensor_to_host(t, v, sizeof v);
    if (st != EBB_OK)
        return ebb_error_prefix("%s: %s", fn, path);
    if (v[0] != SCALER_VERSION)
        return ebb_error_set(EBB_ERR_ARG, "%s: %s: '%s' has format version %g; this ebb reads %d",
                             fn, path, EBB_SCALER_NAME, v[0], SCALER_VERSION);
    ebb_loss_scaling o = {.init_scale = v[1], .growth_factor = v[2], .backoff_factor = v[3],
                          .growth_interval = (int)v[4]};
    st = v[4] == (int)v[4] ? ebb_loss_scaling_check(&o, fn)
                           : ebb_error_set(EBB_ERR_ARG, "growth_interval %g is not a whole number",
                                           v[4]);
    if (st == EBB_OK && !(v[5] >= 0 && v[5] < v[4] && v[5] == (int)v[5]))
        st = ebb_error_set(EBB_ERR_ARG, "growth_tracker %g is not a count below %g", v[5], v[4]);
    if (st != EBB_OK)
        return ebb_error_prefix("%s: '%s'", path, EBB_SCALER_NAME);
    *out = (ebb_loss_scaler){.on = 1, .scale = v[1], .growth = v[2], .backoff = v[3],
                             .interval = (int)v[4], .tracker = (int)v[5]};
    return EBB_OK;
}
