/* `ebb train` and `ebb eval`: a spec trained on a dataset (include/ebb/data.h)
 * with its training plan, checkpointed, resumed, and evaluated.
 *
 * Exit codes as the rest of the command: 0 ok, 1 spec or data error, 2 usage
 * error, 3 runtime error; 130 when SIGINT stopped training (after the step
 * under way finished and a checkpoint was written). */
#define _GNU_SOURCE /* getopt_long */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ebb/ebb.h"
#include "ebb/data.h"
#include "ebb/safetensors.h"
#include "ebb/spec.h"
#include "../fileio.h"
#include "curve.h"
#include "train.h"

enum { EXIT_SPEC = 1, EXIT_USAGE = 2, EXIT_RUNTIME = 3, EXIT_INTERRUPTED = 130 };

#define MAX_FIELDS 64
#define MAX_PARAMS 64
#define DEFAULT_CHECKPOINT "checkpoint.safetensors"

#define USAGE_COMMON                                                                               \
    "  -p NAME=VALUE      set a spec parameter (params:)\n"                                        \
    "  --device DEV       cpu (default) or cuda[:N]\n"                                             \
    "  --json             one JSON object per line instead of text\n"                              \
    "  -h, --help         this help\n"                                                             \
    "  --completion-helper\n"                                                                      \
    "                     print the options above, one a line (for shell completion)\n"

const char ebb_cli_usage_train[] =
    "usage: ebb train SPEC --data D [--eval-data D] [--epochs N | --steps N] [--batch B]\n"
    "                 [--optimizer sgd|adam|adamw] [--lr X] [--momentum X] [--weight-decay X]\n"
    "                 [--seed N] [--no-shuffle] [--drop-last] [--normalize MEAN,STD]\n"
    "                 [--weights W] [--save-weights W] [--checkpoint FILE]\n"
    "                 [--checkpoint-every N] [--resume CKPT] [--log-every N]\n"
    "                 [--curve FILE.svg] [--trace T.jsonl [--trace-step N]]\n"
    "                 [--memory-budget SIZE] [--device DEV] [--json] [-p NAME=VALUE]...\n"
    "\n"
    "Trains the spec on a dataset with its training plan: forward, the spec's loss\n"
    "against its targets, backward and optimizer update, one static plan per step.\n"
    "A dataset D is fashion-mnist (fashion-mnist:test for its test split), a\n"
    "directory of MNIST-style IDX files (DIR or DIR:test), two IDX files\n"
    "IMAGES,LABELS, or a safetensors file holding one tensor per input and target\n"
    "of the spec, samples first.\n"
    "\n"
    "  --data D           the training data (required)\n"
    "  --eval-data D      evaluated after every epoch: loss and accuracy\n"
    "  --epochs N         passes over the data (default 1)\n"
    "  --steps N          stop after N steps instead\n"
    "  --batch B          samples per step (default 64)\n"
    "  --optimizer KIND   sgd, adam or adamw (default adamw)\n"
    "  --lr X             learning rate (default 1e-3; sgd needs one)\n"
    "  --momentum X       sgd's momentum (default 0)\n"
    "  --weight-decay X   (default: torch.optim's, 0.01 for adamw, else 0)\n"
    "  --seed N           initial weights, shuffling and dropout (default 0)\n"
    "  --no-shuffle       the samples in file order\n"
    "  --drop-last        drop the last partial batch of each epoch\n"
    "  --normalize MEAN,STD\n"
    "                     inputs become (x - MEAN) / STD (after images scale to [0, 1])\n"
    "  --weights W        start from these weights (safetensors)\n"
    "  --save-weights W   write the trained weights there at the end\n"
    "  --checkpoint FILE  where checkpoints go (default " DEFAULT_CHECKPOINT ")\n"
    "  --checkpoint-every N\n"
    "                     write a checkpoint every N steps and at the end\n"
    "  --resume CKPT      continue from a checkpoint: weights, optimizer state, step\n"
    "  --log-every N      a line every N steps (default: one per epoch)\n"
    "  --curve FILE.svg   draw the training loss (a point per --log-every N steps, else\n"
    "                     about 200 over the run) and, with --eval-data, the test loss\n"
    "                     and accuracy per epoch; rewritten after every epoch\n"
    "  --trace T          one training step's trace in `ebb run --trace`'s format, one\n"
    "                     JSON line per plan step: `ebb chart SPEC --train -i batch=B\n"
    "                     --trace T` draws it over the training plan\n"
    "  --trace-step N     the step --trace traces (default: the run's first)\n"
    "  --memory-budget SIZE\n"
    "                     plan the step to fit SIZE (64MiB, 1.5GB, or `least`) by\n"
    "                     recomputing activations in the backward; same updates\n" USAGE_COMMON
    "\n"
    "Ctrl-C finishes the step under way, writes a checkpoint and exits 130.\n";

const char ebb_cli_usage_eval[] =
    "usage: ebb eval SPEC --weights W --data D [--batch B] [--device DEV] [--json]\n"
    "                [--normalize MEAN,STD] [-p NAME=VALUE]...\n"
    "\n"
    "Runs the spec's inference plan over a dataset (as `ebb train --data`) and prints\n"
    "'accuracy 0.8912 loss 0.3123 on 10000 samples' for a cross_entropy or nll spec,\n"
    "else 'loss X on N samples' (the loss op with its default options).\n"
    "\n"
    "  --weights W        the trained weights (required)\n"
    "  --data D           the data (required)\n"
    "  --batch B          samples per run (default 256)\n"
    "  --normalize MEAN,STD\n"
    "                     as for ebb train\n" USAGE_COMMON;

enum {
    O_DATA = 300,
    O_EVAL_DATA,
    O_EPOCHS,
    O_STEPS,
    O_BATCH,
    O_OPTIMIZER,
    O_LR,
    O_MOMENTUM,
    O_WEIGHT_DECAY,
    O_SEED,
    O_NO_SHUFFLE,
    O_DROP_LAST,
    O_NORMALIZE,
    O_WEIGHTS,
    O_SAVE_WEIGHTS,
    O_CHECKPOINT,
    O_CHECKPOINT_EVERY,
    O_RESUME,
    O_LOG_EVERY,
    O_TRACE,
    O_TRACE_STEP,
    O_CURVE,
    O_MEMORY_BUDGET,
    O_DEVICE,
    O_JSON,
    O_COMPLETION,
};

#define COMMON_LONGS                                                                               \
    {"help", no_argument, NULL, 'h'}, {"completion-helper", no_argument, NULL, O_COMPLETION},      \
        {"device", required_argument, NULL, O_DEVICE}, {"json", no_argument, NULL, O_JSON},        \
        {"normalize", required_argument, NULL, O_NORMALIZE},                                       \
        {"data", required_argument, NULL, O_DATA}, {"batch", required_argument, NULL, O_BATCH},    \
        {"weights", required_argument, NULL, O_WEIGHTS}

const struct option ebb_cli_train_options[] = {
    COMMON_LONGS,
    {"eval-data", required_argument, NULL, O_EVAL_DATA},
    {"epochs", required_argument, NULL, O_EPOCHS},
    {"steps", required_argument, NULL, O_STEPS},
    {"optimizer", required_argument, NULL, O_OPTIMIZER},
    {"lr", required_argument, NULL, O_LR},
    {"momentum", required_argument, NULL, O_MOMENTUM},
    {"weight-decay", required_argument, NULL, O_WEIGHT_DECAY},
    {"seed", required_argument, NULL, O_SEED},
    {"no-shuffle", no_argument, NULL, O_NO_SHUFFLE},
    {"drop-last", no_argument, NULL, O_DROP_LAST},
    {"save-weights", required_argument, NULL, O_SAVE_WEIGHTS},
    {"checkpoint", required_argument, NULL, O_CHECKPOINT},
    {"checkpoint-every", required_argument, NULL, O_CHECKPOINT_EVERY},
    {"resume", required_argument, NULL, O_RESUME},
    {"log-every", required_argument, NULL, O_LOG_EVERY},
    {"trace", required_argument, NULL, O_TRACE},
    {"trace-step", required_argument, NULL, O_TRACE_STEP},
    {"curve", required_argument, NULL, O_CURVE},
    {"memory-budget", required_argument, NULL, O_MEMORY_BUDGET},
    {NULL, 0, NULL, 0},
};

const struct option ebb_cli_eval_options[] = {COMMON_LONGS, {NULL, 0, NULL, 0}};

typedef struct topts {
    const char *spec, *data, *eval_data, *optimizer, *weights, *save_weights, *checkpoint;
    const char *resume, *trace, *device, *curve;
    const char *params[MAX_PARAMS];
    int n_params;
    int64_t epochs, steps, batch, checkpoint_every, log_every, trace_step;
    double lr, momentum, weight_decay, norm_mean, norm_std;
    int lr_set, momentum_set, wd_set, seed_set, batch_set, normalize, no_shuffle, drop_last, json;
    uint64_t seed;
    int64_t memory_budget; /* 0: none */
} topts;

static int parse_i64(const char *s, int64_t lo, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo)
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < 0)
        return -1;
    *out = v;
    return 0;
}

/* Returns 0, -1 when help was printed, or an exit code. */
static int parse(int argc, char **argv, int train, topts *o) {
    const char *usage = train ? ebb_cli_usage_train : ebb_cli_usage_eval;
    const struct option *longs = train ? ebb_cli_train_options : ebb_cli_eval_options;
    memset(o, 0, sizeof *o);
    o->epochs = 1;
    o->batch = train ? 64 : 256;
    opterr = 0;
    optind = 0;
    int opt;
    char name[64];
    while ((opt = getopt_long(argc, argv, "-:" EBB_CLI_TRAIN_SHORTS, longs, NULL)) != -1) {
        const char *v = optarg;
        int64_t n = 0;
        switch (opt) {
        case 1:
            if (o->spec)
                return ebb_cli_usage_error(usage, "unexpected argument %s", v);
            o->spec = v;
            break;
        case 'h': fputs(usage, stdout); return -1;
        case O_COMPLETION:
            for (const char *s = EBB_CLI_TRAIN_SHORTS; *s; s++)
                if (*s != ':')
                    printf("-%c\n", *s);
            for (const struct option *lo = longs; lo->name; lo++)
                printf("--%s%s\n", lo->name, lo->has_arg == required_argument ? "=" : "");
            return -1;
        case 'p':
            if (o->n_params == MAX_PARAMS)
                return ebb_cli_usage_error(usage, "%s", "too many -p options");
            o->params[o->n_params++] = v;
            break;
        case O_DATA: o->data = v; break;
        case O_EVAL_DATA: o->eval_data = v; break;
        case O_OPTIMIZER:
            if (strcmp(v, "sgd") && strcmp(v, "adam") && strcmp(v, "adamw"))
                return ebb_cli_usage_error(usage, "--optimizer %s: expected sgd, adam or adamw", v);
            o->optimizer = v;
            break;
        case O_WEIGHTS: o->weights = v; break;
        case O_SAVE_WEIGHTS: o->save_weights = v; break;
        case O_CHECKPOINT: o->checkpoint = v; break;
        case O_RESUME: o->resume = v; break;
        case O_TRACE: o->trace = v; break;
        case O_CURVE: o->curve = v; break;
        case O_MEMORY_BUDGET:
            if (!strcmp(v, "least"))
                o->memory_budget = EBB_MEMORY_BUDGET_LEAST;
            else if (ebb_bytes_parse(v, &o->memory_budget) != EBB_OK || o->memory_budget == 0)
                return ebb_cli_usage_error(usage, "--memory-budget %s: expected a byte count above 0, "
                                          "like 64MiB or 1.5GB, or `least`",
                                   v);
            break;
        case O_DEVICE: o->device = v; break;
        case O_JSON: o->json = 1; break;
        case O_NO_SHUFFLE: o->no_shuffle = 1; break;
        case O_DROP_LAST: o->drop_last = 1; break;
        case O_EPOCHS:
        case O_STEPS:
        case O_BATCH:
        case O_CHECKPOINT_EVERY:
        case O_LOG_EVERY:
        case O_TRACE_STEP:
            if (parse_i64(v, 1, &n) != 0 || n > 1000000000)
                return ebb_cli_usage_error(usage, "%s needs a positive integer",
                                   opt == O_EPOCHS       ? "--epochs"
                                   : opt == O_STEPS      ? "--steps"
                                   : opt == O_BATCH      ? "--batch"
                                   : opt == O_LOG_EVERY  ? "--log-every"
                                   : opt == O_TRACE_STEP ? "--trace-step"
                                                         : "--checkpoint-every");
            if (opt == O_EPOCHS)
                o->epochs = n;
            else if (opt == O_STEPS)
                o->steps = n;
            else if (opt == O_BATCH)
                o->batch = n, o->batch_set = 1;
            else if (opt == O_LOG_EVERY)
                o->log_every = n;
            else if (opt == O_TRACE_STEP)
                o->trace_step = n;
            else
                o->checkpoint_every = n;
            break;
        case O_SEED: {
            char *end = NULL;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || errno || *v == '-')
                return ebb_cli_usage_error(usage, "%s", "--seed needs a non-negative integer");
            o->seed = s;
            o->seed_set = 1;
            break;
        }
        case O_LR:
        case O_MOMENTUM:
        case O_WEIGHT_DECAY: {
            double d;
            const char *nm = opt == O_LR ? "--lr" : opt == O_MOMENTUM ? "--momentum" : "--weight-decay";
            if (parse_double(v, &d) != 0)
                return ebb_cli_usage_error(usage, "%s needs a non-negative number", nm);
            if (opt == O_LR)
                o->lr = d, o->lr_set = 1;
            else if (opt == O_MOMENTUM)
                o->momentum = d, o->momentum_set = 1;
            else
                o->weight_decay = d, o->wd_set = 1;
            break;
        }
        case O_NORMALIZE: {
            char *end = NULL;
            o->norm_mean = strtod(v, &end);
            if (end == v || *end != ',')
                return ebb_cli_usage_error(usage, "--normalize %s: expected MEAN,STD", v);
            const char *s2 = end + 1;
            o->norm_std = strtod(s2, &end);
            if (end == s2 || *end || !isfinite(o->norm_mean) || !(o->norm_std > 0) ||
                !isfinite(o->norm_std))
                return ebb_cli_usage_error(usage, "--normalize %s: expected MEAN,STD with STD > 0", v);
            o->normalize = 1;
            break;
        }
        case ':':
            if (optopt == 'p')
                return ebb_cli_usage_error(usage, "%s", "-p needs NAME=VALUE");
            snprintf(name, sizeof name, "%s", argv[optind - 1]);
            return ebb_cli_usage_error(usage, "%s needs a value", name);
        default:
            if (optopt > 0 && optopt < 256) {
                snprintf(name, sizeof name, "-%c", optopt);
                return ebb_cli_usage_error(usage, "unknown option %s", name);
            }
            return ebb_cli_usage_error(usage, "unknown option %s", argv[optind - 1]);
        }
    }
    for (; optind < argc; optind++) {
        if (o->spec)
            return ebb_cli_usage_error(usage, "unexpected argument %s", argv[optind]);
        o->spec = argv[optind];
    }
    if (!o->spec)
        return ebb_cli_usage_error(usage, "%s", "missing SPEC");
    if (!o->data)
        return ebb_cli_usage_error(usage, "%s", "--data is required");
    if (!train && !o->weights)
        return ebb_cli_usage_error(usage, "%s", "--weights is required (the trained weights)");
    if (train && o->weights && o->resume)
        return ebb_cli_usage_error(usage, "%s", "--weights and --resume both give the weights: pick one");
    if (train && o->momentum_set && o->optimizer && strcmp(o->optimizer, "sgd"))
        return ebb_cli_usage_error(usage, "%s", "--momentum applies to --optimizer sgd");
    if (train && o->momentum_set && !o->optimizer)
        return ebb_cli_usage_error(usage, "%s", "--momentum applies to --optimizer sgd (default adamw)");
    if (train && o->optimizer && !strcmp(o->optimizer, "sgd") && !o->lr_set && !o->resume)
        return ebb_cli_usage_error(usage, "%s", "--optimizer sgd needs --lr");
    if (train && o->trace_step && !o->trace)
        return ebb_cli_usage_error(usage, "%s", "--trace-step needs --trace T.jsonl, the file it writes");
    /* the picture is SVG whatever the name says; a name that says otherwise
     * is a mistake (as for `ebb chart -o`) */
    const char *base = o->curve ? strrchr(o->curve, '/') : NULL;
    const char *ext = o->curve ? strrchr(base ? base : o->curve, '.') : NULL;
    if (ext && strcmp(ext, ".svg"))
        return ebb_cli_usage_error(usage,
                           "--curve %s: the curves are SVG; name it .svg (rsvg-convert makes a "
                           "PNG of it)",
                           o->curve);
    return 0;
}

/* ---- the spec, its plans and the data -------------------------------------- */

typedef struct job {
    ebb_spec *spec;
    int n_in, n_tg, n_fields;
    const char *names[MAX_FIELDS]; /* inputs, then targets */
    ebb_dtype dtypes[MAX_FIELDS];
    const char *loss;              /* the spec's loss op */
    int classify;                  /* cross_entropy or nll: accuracy is counted */
    ebb_device dev;
} job;

static int load_job(job *j, const topts *o) {
    memset(j, 0, sizeof *j);
    j->dev = ebb_device_default();
    ebb_status st;
    if (o->device && (st = ebb_device_parse(&j->dev, o->device)) != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return st == EBB_ERR_UNSUPPORTED ? EXIT_RUNTIME : EXIT_USAGE;
    }
    ebb_spec_options so = {.params = o->params, .n_params = o->n_params};
    if ((st = ebb_spec_load_ex(&j->spec, o->spec, &so)) != EBB_OK)
        return ebb_cli_fail_status(st);
    j->n_in = ebb_spec_input_count(j->spec);
    j->n_tg = ebb_spec_target_count(j->spec);
    if (j->n_tg == 0) {
        fprintf(stderr,
                "ebb: %s declares no `targets:`; training and evaluation compare the output with "
                "them (see docs/spec-format.md)\n",
                ebb_spec_file(j->spec));
        return EXIT_SPEC;
    }
    if (j->n_in + j->n_tg > MAX_FIELDS) {
        fprintf(stderr, "ebb: %s has more than %d inputs and targets\n", ebb_spec_file(j->spec),
                MAX_FIELDS);
        return EXIT_SPEC;
    }
    for (int i = 0; i < j->n_in; i++) {
        j->names[i] = ebb_spec_input_name(j->spec, i);
        if (!ebb_spec_input_dtype(j->spec, i, &j->dtypes[i]))
            j->dtypes[i] = EBB_FLOAT32;
    }
    for (int i = 0; i < j->n_tg; i++) {
        j->names[j->n_in + i] = ebb_spec_target_name(j->spec, i);
        if (!ebb_spec_target_dtype(j->spec, i, &j->dtypes[j->n_in + i]))
            j->dtypes[j->n_in + i] = EBB_FLOAT32;
    }
    j->n_fields = j->n_in + j->n_tg;
    j->loss = ebb_graph_loss(ebb_spec_graph(j->spec));
    if (!j->loss) {
        fprintf(stderr, "ebb: %s declares no `loss:`\n", ebb_spec_file(j->spec));
        return EXIT_SPEC;
    }
    j->classify = !strcmp(j->loss, "cross_entropy") || !strcmp(j->loss, "nll");
    return 0;
}

/* Shapes for a batch of B: every input's and target's symbolic first
 * dimension bound to B. */
static int batch_shapes(const job *j, int64_t batch, ebb_shape *in, ebb_shape *tg) {
    const char *bind[MAX_FIELDS];
    char buf[MAX_FIELDS][96];
    int nb = 0;
    for (int i = 0; i < j->n_in && nb < MAX_FIELDS; i++) {
        const char *sym = NULL;
        if (ebb_spec_input_ndim(j->spec, i) > 0 && ebb_spec_input_dim(j->spec, i, 0, &sym) < 0 &&
            sym) {
            int dup = 0;
            for (int k = 0; k < nb; k++)
                dup |= !strncmp(buf[k], sym, strlen(sym)) && buf[k][strlen(sym)] == '=';
            if (!dup) {
                snprintf(buf[nb], sizeof buf[nb], "%s=%lld", sym, (long long)batch);
                bind[nb] = buf[nb];
                nb++;
            }
        }
    }
    ebb_status st = ebb_spec_resolve_shapes(j->spec, bind, nb, in, MAX_FIELDS);
    if (st == EBB_OK && tg)
        st = ebb_spec_resolve_target_shapes(j->spec, bind, nb, tg, MAX_FIELDS);
    if (st != EBB_OK)
        return ebb_cli_fail_status(st);
    for (int i = 0; i < j->n_in + (tg ? j->n_tg : 0); i++) {
        const ebb_shape *s = i < j->n_in ? &in[i] : &tg[i - j->n_in];
        if (s->ndim < 1 || s->dim[0] != batch) {
            fprintf(stderr,
                    "ebb: %s: '%s' has no symbolic first dimension (the batch) that --batch %lld "
                    "can set\n",
                    ebb_spec_file(j->spec), j->names[i], (long long)batch);
            return EXIT_SPEC;
        }
    }
    return 0;
}

/* The training plan when `optim` is given (under `budget`, 0: none), else
 * the inference plan. */
static int compile_plan(const job *j, int64_t batch, const ebb_optimizer_options *optim,
                        int64_t budget, ebb_plan **out) {
    ebb_shape in[MAX_FIELDS], tg[MAX_FIELDS];
    int rc = batch_shapes(j, batch, in, optim ? tg : NULL);
    if (rc)
        return rc;
    ebb_train_options to = {0};
    ebb_compile_options co = {.input_shapes = in, .n_input_shapes = j->n_in};
    if (optim) {
        to = (ebb_train_options){.target_shapes = tg,
                                 .n_target_shapes = j->n_tg,
                                 .target_dtypes = j->dtypes + j->n_in,
                                 .optimizer = *optim};
        co.train = &to;
        co.memory_budget = budget;
    }
    ebb_status st = ebb_spec_compile(out, j->spec, &co);
    return st == EBB_OK ? 0 : ebb_cli_fail_status(st);
}

static int open_data(const job *j, const topts *o, const char *desc, const ebb_plan *infer,
                     ebb_dataset **out) {
    ebb_status st = ebb_dataset_open(out, desc, j->names, j->n_fields);
    for (int i = 0; st == EBB_OK && o->normalize && i < j->n_in; i++)
        st = ebb_dataset_set_normalize(*out, i, o->norm_mean, o->norm_std);
    if (st == EBB_OK && j->classify && infer && ebb_plan_output_count(infer) > 0) {
        const ebb_plan_value *v = ebb_plan_value_at(infer, ebb_plan_output_slot(infer, 0));
        if (v->shape.ndim >= 1)
            st = ebb_dataset_check_classes(*out, j->n_in, v->shape.dim[v->shape.ndim - 1]);
    }
    if (st == EBB_OK && ebb_dataset_size(*out) == 0)
        st = ebb_error_set(EBB_ERR_ARG, "dataset '%s' has no samples", desc);
    if (st != EBB_OK) {
        ebb_dataset_free(*out);
        *out = NULL;
        return ebb_cli_fail_status(st);
    }
    return 0;
}

/* Field tensors for samples order[0..count). */
static ebb_status make_batch(const job *j, const ebb_dataset *d, const int64_t *index,
                             int64_t count, ebb_tensor **ts) {
    ebb_shape in[MAX_FIELDS], tg[MAX_FIELDS];
    if (batch_shapes(j, count, in, tg) != 0)
        return ebb_errcode() ? ebb_errcode() : EBB_ERR_SHAPE;
    for (int i = 0; i < j->n_fields; i++) {
        const ebb_shape *s = i < j->n_in ? &in[i] : &tg[i - j->n_in];
        ebb_status st = ebb_dataset_batch(&ts[i], d, i, index, count, s, j->dtypes[i], j->dev);
        if (st != EBB_OK) {
            for (int k = 0; k < i; k++) {
                ebb_tensor_free(ts[k]);
                ts[k] = NULL;
            }
            return st;
        }
    }
    return EBB_OK;
}

static void free_batch(ebb_tensor **ts, int n) {
    for (int i = 0; i < n; i++) {
        ebb_tensor_free(ts[i]);
        ts[i] = NULL;
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The loss (mean over the batch) and the number of correct argmaxes. */
static ebb_status batch_loss(const job *j, const ebb_tensor *out, const ebb_tensor *target,
                             double *loss, int64_t *correct) {
    ebb_tensor *l = NULL;
    ebb_status st;
    if (!strcmp(j->loss, "cross_entropy"))
        st = ebb_tensor_cross_entropy(&l, NULL, NULL, out, target, -100, 0.0);
    else if (!strcmp(j->loss, "nll"))
        st = ebb_tensor_nll_loss(&l, NULL, out, target, -100);
    else if (!strcmp(j->loss, "mse"))
        st = ebb_tensor_mse_loss(&l, out, target);
    else if (!strcmp(j->loss, "bce_with_logits"))
        st = ebb_tensor_bce_with_logits(&l, out, target);
    else
        st = ebb_error_set(EBB_ERR_UNSUPPORTED, "ebb eval: loss '%s' is not one it computes",
                           j->loss);
    if (st == EBB_OK)
        st = ebb_tensor_item(l, loss);
    ebb_tensor_free(l);
    *correct = 0;
    if (st != EBB_OK || !j->classify)
        return st;
    ebb_tensor *am = NULL, *am_cpu = NULL, *tg_cpu = NULL;
    st = ebb_tensor_argmax(&am, out, -1);
    if (st == EBB_OK)
        st = ebb_tensor_to(&am_cpu, am, ebb_device_cpu(), EBB_INT64);
    if (st == EBB_OK)
        st = ebb_tensor_to(&tg_cpu, target, ebb_device_cpu(), EBB_INT64);
    int64_t n = ebb_tensor_numel(tg_cpu);
    int64_t *a = st == EBB_OK ? malloc(sizeof *a * (size_t)(2 * n + 1)) : NULL;
    if (st == EBB_OK && !a)
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK && ebb_tensor_numel(am_cpu) != n)
        st = ebb_error_set(EBB_ERR_SHAPE, "ebb eval: %lld predictions for %lld targets",
                           (long long)ebb_tensor_numel(am_cpu), (long long)n);
    if (st == EBB_OK)
        st = ebb_tensor_to_host(am_cpu, a, sizeof *a * (size_t)n);
    if (st == EBB_OK)
        st = ebb_tensor_to_host(tg_cpu, a + n, sizeof *a * (size_t)n);
    for (int64_t k = 0; st == EBB_OK && k < n; k++)
        *correct += a[k] == a[n + k];
    free(a);
    ebb_tensor_free(am);
    ebb_tensor_free(am_cpu);
    ebb_tensor_free(tg_cpu);
    return st;
}

/* The mean loss and the accuracy over a whole dataset, in order. */
static ebb_status evaluate(const job *j, const ebb_plan *plan, const ebb_model *m,
                           const ebb_dataset *d, int64_t batch, double *loss, double *accuracy) {
    int64_t n = ebb_dataset_size(d), correct = 0;
    int64_t *order = malloc(sizeof *order * (size_t)n);
    if (!order)
        return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    ebb_dataset_order(order, n, 0, 0);
    double sum = 0;
    ebb_status st = EBB_OK;
    ebb_tensor *ts[MAX_FIELDS] = {0};
    for (int64_t at = 0; st == EBB_OK && at < n; at += batch) {
        int64_t cnt = n - at < batch ? n - at : batch, c = 0;
        ebb_tensor *out = NULL;
        double l = 0;
        st = make_batch(j, d, order + at, cnt, ts);
        if (st == EBB_OK)
            st = ebb_run(plan, m, ts, &out, NULL);
        if (st == EBB_OK)
            st = batch_loss(j, out, ts[j->n_in], &l, &c);
        ebb_tensor_free(out);
        free_batch(ts, j->n_fields);
        sum += l * (double)cnt;
        correct += c;
    }
    free(order);
    *loss = sum / (double)n;
    *accuracy = (double)correct / (double)n;
    return st;
}

/* ---- checkpoints ----------------------------------------------------------- */

static const char *const slot_names[] = {"momentum_buffer", "exp_avg", "exp_avg_sq",
                                         "max_exp_avg_sq"};
#define N_SLOTS 4

/* Weights, optimizer state (optim.* as ebb_optimizer_save names it) and
 * __metadata__, in one atomic safetensors file. */
static ebb_status save_checkpoint(const char *path, const ebb_model *m, const ebb_optimizer *opt,
                                  int64_t step, int64_t epoch, const topts *o) {
    int np = ebb_model_param_count(m), cap = np * (N_SLOTS + 2) + 1, n = 0;
    char **names = calloc((size_t)cap, sizeof *names);
    ebb_tensor **ts = calloc((size_t)cap, sizeof *ts);
    char *made = calloc((size_t)cap, 1);
    ebb_status st = names && ts && made ? EBB_OK : ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    for (int i = 0; st == EBB_OK && i < np; i++) {
        const char *pn = ebb_model_param_name(m, i);
        names[n] = strdup(pn);
        ts[n++] = ebb_model_param(m, pn);
        for (int k = 0; k <= N_SLOTS && st == EBB_OK; k++) {
            int is_step = k == N_SLOTS;
            if (is_step ? ebb_optimizer_param_step_count(opt, i) <= 0
                        : !ebb_optimizer_state_tensor(opt, i, slot_names[k]))
                continue;
            size_t len = strlen(pn) + 32;
            names[n] = malloc(len);
            if (names[n])
                snprintf(names[n], len, "optim.%s.%s", pn, is_step ? "step" : slot_names[k]);
            if (is_step) {
                ebb_shape scalar = {0, {0}};
                made[n] = 1;
                st = ebb_tensor_full(&ts[n], &scalar,
                                     (double)ebb_optimizer_param_step_count(opt, i), EBB_FLOAT64,
                                     ebb_device_cpu());
            } else {
                ts[n] = ebb_optimizer_state_tensor(opt, i, slot_names[k]);
            }
            n++;
        }
    }
    if (st == EBB_OK) {
        ebb_optimizer_options oo = ebb_optimizer_get_options(opt);
        double v[11] = {1, (double)oo.kind, oo.lr,    oo.momentum, oo.dampening, oo.nesterov,
                        oo.weight_decay, oo.beta1, oo.beta2, oo.eps, oo.amsgrad};
        ebb_shape sh = {1, {11}};
        names[n] = strdup("optim.options");
        made[n] = 1;
        st = ebb_tensor_from_host(&ts[n++], v, sizeof v, &sh, EBB_FLOAT64, ebb_device_cpu());
    }
    for (int i = 0; st == EBB_OK && i < n; i++)
        if (!names[i])
            st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK) {
        char s_step[32], s_epoch[32], s_seed[32], s_batch[32];
        snprintf(s_step, sizeof s_step, "%lld", (long long)step);
        snprintf(s_epoch, sizeof s_epoch, "%lld", (long long)epoch);
        snprintf(s_seed, sizeof s_seed, "%llu", (unsigned long long)o->seed);
        snprintf(s_batch, sizeof s_batch, "%lld", (long long)o->batch);
        const char *meta[] = {"ebb_checkpoint", "1",     "step",    s_step,
                              "epoch",          s_epoch, "seed",    s_seed,
                              "batch",          s_batch, "shuffle", o->no_shuffle ? "0" : "1",
                              "drop_last",      o->drop_last ? "1" : "0"};
        st = ebb_safetensors_write_meta(path, (const char *const *)names, ts, n, meta,
                                        (int)(sizeof meta / sizeof meta[0] / 2));
    }
    for (int i = 0; names && ts && made && i < n; i++) {
        free(names[i]);
        if (made[i])
            ebb_tensor_free(ts[i]);
    }
    free(names);
    free(ts);
    free(made);
    return st;
}

typedef struct ckpt_info {
    int64_t step;
    uint64_t seed;
    int64_t batch;
    int shuffle, drop_last;
    ebb_optimizer_options optim;
} ckpt_info;

static int meta_i64(const ebb_safetensors *sf, const char *key, int64_t *out) {
    const char *v = ebb_safetensors_metadata(sf, key);
    return v && parse_i64(v, 0, out) == 0;
}

static ebb_status read_checkpoint_info(const char *path, ckpt_info *ci) {
    ebb_safetensors *sf = NULL;
    ebb_status st = ebb_safetensors_open(&sf, path);
    if (st != EBB_OK)
        return st;
    int64_t seed = 0, shuffle = 0, drop = 0;
    ebb_tensor *t = NULL;
    double v[11];
    ebb_shape sh;
    ebb_dtype dt;
    if (!ebb_safetensors_metadata(sf, "ebb_checkpoint") || !meta_i64(sf, "step", &ci->step) ||
        !meta_i64(sf, "seed", &seed) || !meta_i64(sf, "batch", &ci->batch) ||
        !meta_i64(sf, "shuffle", &shuffle) || !meta_i64(sf, "drop_last", &drop))
        st = ebb_error_set(EBB_ERR_ARG, "%s: not an ebb train checkpoint (its __metadata__ lacks "
                           "ebb_checkpoint, step, seed, batch, shuffle or drop_last)", path);
    else if (ebb_safetensors_find(sf, "optim.options", &dt, &sh) != EBB_OK || dt != EBB_FLOAT64 ||
             sh.ndim != 1 || sh.dim[0] != 11)
        st = ebb_error_set(EBB_ERR_ARG, "%s: no optim.options (float64 [11])", path);
    else if ((st = ebb_safetensors_load(&t, sf, "optim.options", ebb_device_cpu())) == EBB_OK)
        st = ebb_tensor_to_host(t, v, sizeof v);
    ebb_tensor_free(t);
    ebb_safetensors_close(sf);
    if (st != EBB_OK)
        return st;
    ci->seed = (uint64_t)seed;
    ci->shuffle = shuffle != 0;
    ci->drop_last = drop != 0;
    ci->optim = (ebb_optimizer_options){.kind = (ebb_optimizer_kind)(int)v[1],
                                        .lr = v[2],
                                        .momentum = v[3],
                                        .dampening = v[4],
                                        .nesterov = (int)v[5],
                                        .weight_decay = v[6],
                                        .beta1 = v[7],
                                        .beta2 = v[8],
                                        .eps = v[9],
                                        .amsgrad = (int)v[10],
                                        .complete = 1};
    return EBB_OK;
}

/* Every parameter of the model, read from the checkpoint in place. */
static ebb_status load_checkpoint_weights(const char *path, ebb_model *m) {
    ebb_safetensors *sf = NULL;
    ebb_status st = ebb_safetensors_open(&sf, path);
    for (int i = 0; st == EBB_OK && i < ebb_model_param_count(m); i++) {
        const char *pn = ebb_model_param_name(m, i);
        if (!ebb_safetensors_dtype_str(sf, pn))
            st = ebb_error_set(EBB_ERR_ARG, "%s: missing parameter '%s'", path, pn);
        else
            st = ebb_safetensors_load_into(sf, pn, ebb_model_param(m, pn));
    }
    ebb_safetensors_close(sf);
    return st;
}

/* ---- train ----------------------------------------------------------------- */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    signal(SIGINT, SIG_DFL); /* a second Ctrl-C stops at once */
}

/* Samples seen after `step` steps: whole epochs, then the batches of the
 * epoch under way (the last one partial unless --drop-last). */
static int64_t samples_at(int64_t step, int64_t per_epoch, int64_t epoch_samples, int64_t batch) {
    int64_t in_epoch = (step % per_epoch) * batch;
    return step / per_epoch * epoch_samples + (in_epoch < epoch_samples ? in_epoch : epoch_samples);
}

static void fmt_eta(double s, char *buf, size_t size) {
    if (!(s >= 0) || s > 1e7)
        snprintf(buf, size, "?");
    else if (s >= 3600)
        snprintf(buf, size, "%d:%02d:%02d", (int)(s / 3600), (int)(s / 60) % 60, (int)s % 60);
    else
        snprintf(buf, size, "%d:%02d", (int)(s / 60), (int)s % 60);
}

int ebb_cli_train(int argc, char **argv) {
    topts o;
    int rc = parse(argc, argv, 1, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *ckpt_path = o.checkpoint ? o.checkpoint : DEFAULT_CHECKPOINT;
    if ((o.save_weights && ebb_file_check_writable(o.save_weights, "--save-weights") != EBB_OK) ||
        (o.trace && ebb_file_check_writable(o.trace, "--trace") != EBB_OK) ||
        (o.curve && ebb_file_check_writable(o.curve, "--curve") != EBB_OK) ||
        (o.checkpoint && ebb_file_check_writable(o.checkpoint, "--checkpoint") != EBB_OK)) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    job j;
    ebb_plan *plan = NULL, *infer = NULL;
    ebb_model *m = NULL;
    ebb_optimizer *opt = NULL;
    ebb_dataset *train = NULL, *test = NULL;
    int64_t *order = NULL;
    ebb_file_out *tw = NULL;
    /* --trace: one training step in the format of `ebb run --trace`
     * (docs/cli.md), so that `ebb chart --train --trace` draws it over the
     * training plan; one step, as the plan is the same for each */
    ebb_cli_trace trace = {0};
    ebb_cli_curve *curve = NULL;
    ebb_tensor *ts[MAX_FIELDS] = {0};
    ebb_status st;
    ckpt_info ci = {0};
    struct sigaction sa = {0}, old_sa;
    int sig_installed = 0;
    if ((rc = load_job(&j, &o)))
        goto done;
    const char *kind = o.optimizer ? o.optimizer : "adamw";
    ebb_optimizer_kind k = !strcmp(kind, "sgd") ? EBB_SGD : !strcmp(kind, "adam") ? EBB_ADAM
                                                                                  : EBB_ADAMW;
    ebb_optimizer_options oo = ebb_optimizer_defaults(k, o.lr_set ? o.lr : 1e-3);
    if (o.momentum_set)
        oo.momentum = o.momentum;
    if (o.wd_set)
        oo.weight_decay = o.weight_decay;
    if (o.resume) {
        if ((st = read_checkpoint_info(o.resume, &ci)) != EBB_OK) {
            rc = ebb_cli_fail_status(st);
            goto done;
        }
        if ((o.seed_set && o.seed != ci.seed) || (o.batch_set && o.batch != ci.batch)) {
            fprintf(stderr,
                    "ebb: %s was made with --seed %llu --batch %lld; resuming needs the same\n",
                    o.resume, (unsigned long long)ci.seed, (long long)ci.batch);
            rc = EXIT_USAGE;
            goto done;
        }
        o.seed = ci.seed;
        o.batch = ci.batch;
        o.no_shuffle = !ci.shuffle;
        o.drop_last = ci.drop_last;
        oo = ci.optim;
        /* the checkpoint's optimizer, for what is printed and drawn */
        kind = oo.kind == EBB_SGD ? "sgd" : oo.kind == EBB_ADAM ? "adam" : "adamw";
    }
    if ((rc = compile_plan(&j, o.batch, &oo, o.memory_budget, &plan)) ||
        (rc = compile_plan(&j, o.batch, NULL, 0, &infer)))
        goto done;
    if ((rc = open_data(&j, &o, o.data, infer, &train)) ||
        (o.eval_data && (rc = open_data(&j, &o, o.eval_data, infer, &test))))
        goto done;
    if ((st = ebb_model_new(&m, plan, j.dev, o.seed)) != EBB_OK ||
        (o.weights && (st = ebb_model_load(m, o.weights)) != EBB_OK) ||
        (st = ebb_optimizer_new(&opt, m, &oo)) != EBB_OK ||
        (o.resume && (st = load_checkpoint_weights(o.resume, m)) != EBB_OK) ||
        (o.resume && (st = ebb_optimizer_load(opt, o.resume)) != EBB_OK)) {
        rc = ebb_cli_fail_status(st);
        goto done;
    }
    int64_t n = ebb_dataset_size(train);
    if (o.drop_last && n < o.batch) {
        fprintf(stderr, "ebb: --drop-last with --batch %lld leaves no step: %s has %lld samples\n",
                (long long)o.batch, o.data, (long long)n);
        rc = EXIT_USAGE;
        goto done;
    }
    int64_t per_epoch = o.drop_last ? n / o.batch : (n + o.batch - 1) / o.batch;
    int64_t total = o.steps ? o.steps : o.epochs * per_epoch;
    int64_t step = ci.step, epochs = (total + per_epoch - 1) / per_epoch;
    /* the step --trace traces, counted as the log counts them (from 1) */
    int64_t trace_at = o.trace_step ? o.trace_step : step + 1;
    if (o.trace && (trace_at <= step || trace_at > total)) {
        fprintf(stderr, "ebb: --trace-step %lld: this run takes steps %lld to %lld\n",
                (long long)trace_at, (long long)step + 1, (long long)total);
        rc = EXIT_USAGE;
        goto done;
    }
    if (!(order = malloc(sizeof *order * (size_t)n))) {
        rc = ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
        goto done;
    }
    if (o.trace) {
        if (ebb_file_begin(&tw, o.trace, "--trace") != EBB_OK) {
            fprintf(stderr, "ebb: %s\n", ebb_errmsg());
            rc = EXIT_RUNTIME;
            goto done;
        }
        trace = (ebb_cli_trace){.f = ebb_file_stream(tw), .plan = plan};
    }
    /* --curve: a training-loss point per logged window, else about 200
     * points over the run, which a picture 700 px wide still shows apart */
    int64_t epoch_samples = o.drop_last ? per_epoch * o.batch : n;
    int64_t window = o.log_every ? o.log_every : (total - step + 199) / 200;
    if (window < 1)
        window = 1;
    if (o.curve) {
        char context[1024];
        snprintf(context, sizeof context, "%s on %s, batch %lld, %s lr %g", ebb_spec_file(j.spec),
                 o.data, (long long)o.batch, kind, ebb_optimizer_get_options(opt).lr);
        const char *name = ebb_spec_name(j.spec);
        ebb_cli_curve_info info = {
            .name = name && *name ? name : ebb_spec_file(j.spec),
            .context = context,
            .samples_per_epoch = epoch_samples,
            .first_samples = samples_at(step, per_epoch, epoch_samples, o.batch),
            .last_samples = samples_at(total, per_epoch, epoch_samples, o.batch),
            .window = window,
            .eval = test != NULL,
            .accuracy = test && j.classify,
        };
        if ((st = ebb_cli_curve_new(&curve, &info)) != EBB_OK) {
            rc = ebb_cli_fail_status(st);
            goto done;
        }
    }
    int tty = !o.json && isatty(1);
    int64_t planned = ebb_plan_device_peak_bytes(plan, j.dev), measured = 0;
    if (!o.json)
        printf("training %s on %s: %lld samples, batch %lld, %lld steps per epoch, %s lr %g\n",
               ebb_spec_file(j.spec), o.data, (long long)n, (long long)o.batch,
               (long long)per_epoch, kind, ebb_optimizer_get_options(opt).lr);
    if (o.memory_budget && !o.json) {
        ebb_remat_stats rs;
        char bb[32], pk[32], nb[32];
        if (ebb_plan_remat_stats(plan, &rs) == EBB_OK)
            printf("memory budget %s: the step's peak %s, %s keeping every activation; %d "
                   "steps recomputed, %.0f%% more compute\n",
                   rs.budget == EBB_MEMORY_BUDGET_LEAST ? "least"
                                                        : ebb_bytes_str(rs.budget, bb, sizeof bb),
                   ebb_bytes_str(rs.peak_bytes, pk, sizeof pk),
                   ebb_bytes_str(rs.no_recompute_peak_bytes, nb, sizeof nb), rs.n_recompute_steps,
                   rs.flops ? 100.0 * (double)rs.recompute_flops / (double)rs.flops : 0.0);
    }
    if (step > 0 && !o.json)
        printf("resumed from %s at step %lld\n", o.resume, (long long)step);
    fflush(stdout);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sig_installed = sigaction(SIGINT, &sa, &old_sa) == 0;
    double t0 = now_s(), t_epoch = t0, last_draw = 0, run_loss = 0, epoch_loss = 0, curve_loss = 0;
    int64_t run_n = 0, epoch_steps = 0, done_steps = 0, last_ckpt = -1, curve_n = 0;
    int64_t shuffled_epoch = -1;
    while (step < total) {
        int64_t e = step / per_epoch, kstep = step % per_epoch;
        if (e != shuffled_epoch) {
            ebb_dataset_order(order, n, o.seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(e + 1)),
                              !o.no_shuffle);
            shuffled_epoch = e;
        }
        int64_t at = kstep * o.batch, cnt = n - at < o.batch ? n - at : o.batch;
        double loss = 0;
        ebb_run_stats stats = {0};
        int traced = tw && step + 1 == trace_at;
        ebb_run_options ro = {.seed = o.seed, .trace = traced ? ebb_cli_trace_step : NULL,
                              .trace_user = &trace};
        st = make_batch(&j, train, order + at, cnt, ts);
        if (st == EBB_OK)
            st = ebb_train_step_ex(plan, m, opt, ts, ts + j.n_in, &loss, &ro, &stats);
        free_batch(ts, j.n_fields);
        if (st != EBB_OK) {
            rc = ebb_cli_fail_status(ebb_spec_annotate_error(j.spec, st));
            goto done;
        }
        if (stats.measured_peak_bytes > measured)
            measured = stats.measured_peak_bytes;
        step++;
        done_steps++;
        run_loss += loss;
        run_n++;
        epoch_loss += loss;
        epoch_steps++;
        curve_loss += loss;
        curve_n++;
        if (traced) {
            char dn[32];
            fprintf(trace.f,
                    "{\"summary\": {\"steps\": %lld, \"peak_bytes\": %lld, "
                    "\"planned_peak_bytes\": %lld, \"peak_kind\": \"%s\", \"training_step\": %lld, "
                    "\"epoch\": %lld, \"loss\": %.9g, \"device\": \"%s\"}}\n",
                    (long long)trace.steps, (long long)stats.measured_peak_bytes,
                    (long long)planned, ebb_plan_peak_is_bound(plan) ? "bound" : "exact",
                    (long long)step, (long long)e + 1, loss,
                    ebb_device_str(j.dev, dn, sizeof dn));
            /* written now, not at the end: a long run's trace is there to
             * look at while it trains */
            st = ebb_file_commit(tw);
            tw = NULL;
            if (st != EBB_OK) {
                fprintf(stderr, "ebb: %s\n", ebb_errmsg());
                rc = EXIT_RUNTIME;
                goto done;
            }
            if (!o.json) {
                const char *sym = NULL;
                if (tty)
                    printf("\n");
                ebb_spec_input_dim(j.spec, 0, 0, &sym);
                printf("trace of step %lld written to %s; draw it with: ebb chart %s --train -i "
                       "%s=%lld",
                       (long long)step, o.trace, ebb_spec_file(j.spec), sym ? sym : "batch",
                       (long long)o.batch);
                for (int i = 0; i < o.n_params; i++)
                    printf(" -p %s", o.params[i]);
                if (strcmp(kind, "adamw"))
                    printf(" --optimizer %s", kind);
                if (o.memory_budget == EBB_MEMORY_BUDGET_LEAST)
                    printf(" --memory-budget least");
                else if (o.memory_budget)
                    printf(" --memory-budget %lld", (long long)o.memory_budget);
                printf(" --trace %s -o chart.svg\n", o.trace);
                fflush(stdout);
            }
        }
        if (curve && (step % window == 0 || step == total || interrupted)) {
            st = ebb_cli_curve_step(curve, step,
                                    samples_at(step, per_epoch, epoch_samples, o.batch),
                                    curve_loss / (double)curve_n);
            curve_loss = 0;
            curve_n = 0;
            if (st != EBB_OK) {
                rc = ebb_cli_fail_status(st);
                goto done;
            }
        }
        double t = now_s(), rate = (double)(done_steps * o.batch) / (t - t0 > 1e-9 ? t - t0 : 1e-9);
        if (o.log_every && step % o.log_every == 0) {
            if (o.json)
                printf("{\"type\": \"step\", \"epoch\": %lld, \"step\": %lld, \"steps\": %lld, "
                       "\"loss\": %.9g, \"samples_per_s\": %.1f}\n",
                       (long long)e + 1, (long long)step, (long long)total, run_loss / (double)run_n,
                       rate);
            else if (!tty)
                printf("epoch %lld step %lld/%lld loss %.4f %.0f samples/s\n", (long long)e + 1,
                       (long long)step, (long long)total, run_loss / (double)run_n, rate);
            run_loss = 0;
            run_n = 0;
            fflush(stdout); /* a log read as it is written (a pipe, tail -f) */
        }
        if (tty && (t - last_draw > 0.2 || step == total)) {
            char eta[32], mb[32], pb[32];
            fmt_eta((double)(total - step) * o.batch / rate, eta, sizeof eta);
            printf("\repoch %lld/%lld step %lld/%lld %.0f samples/s loss %.4f ETA %s peak %s/%s "
                   "planned\033[K",
                   (long long)e + 1, (long long)epochs, (long long)step, (long long)total, rate,
                   epoch_loss / (double)epoch_steps, eta, ebb_bytes_str(measured, mb, sizeof mb),
                   ebb_bytes_str(planned, pb, sizeof pb));
            fflush(stdout);
            last_draw = t;
        }
        int epoch_end = step % per_epoch == 0 || step == total;
        if (epoch_end) {
            double el = 0, acc = 0;
            if (test && (st = evaluate(&j, infer, m, test, o.batch, &el, &acc)) != EBB_OK) {
                if (tty)
                    printf("\n");
                rc = ebb_cli_fail_status(st);
                goto done;
            }
            double secs = t - t_epoch;
            if (o.json) {
                printf("{\"type\": \"epoch\", \"epoch\": %lld, \"step\": %lld, \"loss\": %.9g, "
                       "\"seconds\": %.3f",
                       (long long)e + 1, (long long)step, epoch_loss / (double)epoch_steps, secs);
                if (test)
                    printf(", \"eval_loss\": %.9g, \"eval_samples\": %lld", el,
                           (long long)ebb_dataset_size(test));
                if (test && j.classify)
                    printf(", \"eval_accuracy\": %.9g", acc);
                printf("}\n");
            } else {
                if (tty)
                    printf("\n");
                printf("epoch %lld: loss %.4f (%lld steps, %.1f s, %.0f samples/s)\n",
                       (long long)e + 1, epoch_loss / (double)epoch_steps, (long long)epoch_steps,
                       secs, (double)(epoch_steps * o.batch) / (secs > 1e-9 ? secs : 1e-9));
                if (test && j.classify)
                    printf("eval: accuracy %.4f loss %.4f on %lld samples\n", acc, el,
                           (long long)ebb_dataset_size(test));
                else if (test)
                    printf("eval: loss %.4f on %lld samples\n", el,
                           (long long)ebb_dataset_size(test));
            }
            fflush(stdout);
            /* the picture after every epoch: a run stopped later still has it */
            if (curve &&
                ((st = ebb_cli_curve_epoch(curve, e + 1,
                                           samples_at(step, per_epoch, epoch_samples, o.batch),
                                           epoch_loss / (double)epoch_steps, test ? el : NAN,
                                           test && j.classify ? acc : NAN)) != EBB_OK ||
                 (st = ebb_cli_curve_save(curve, o.curve, "--curve")) != EBB_OK)) {
                fprintf(stderr, "ebb: %s\n", ebb_errmsg());
                rc = EXIT_RUNTIME;
                goto done;
            }
            epoch_loss = 0;
            epoch_steps = 0;
            t_epoch = now_s();
        }
        if ((o.checkpoint_every && step % o.checkpoint_every == 0) || interrupted) {
            if ((st = save_checkpoint(ckpt_path, m, opt, step, step / per_epoch, &o)) != EBB_OK) {
                fprintf(stderr, "ebb: %s\n", ebb_errmsg());
                rc = EXIT_RUNTIME;
                goto done;
            }
            last_ckpt = step;
        }
        if (interrupted) {
            if (tty)
                printf("\n");
            fflush(stdout);
            if (curve && !epoch_end &&
                (st = ebb_cli_curve_save(curve, o.curve, "--curve")) != EBB_OK)
                fprintf(stderr, "ebb: %s\n", ebb_errmsg());
            if (tw)
                fprintf(stderr, "ebb: --trace: step %lld was not reached; %s is left as it was\n",
                        (long long)trace_at, o.trace);
            fprintf(stderr, "ebb: interrupted after step %lld; checkpoint written to %s (resume "
                    "with --resume %s)\n", (long long)step, ckpt_path, ckpt_path);
            rc = EXIT_INTERRUPTED;
            goto done;
        }
    }
    if (o.checkpoint_every && last_ckpt != step &&
        (st = save_checkpoint(ckpt_path, m, opt, step, step / per_epoch, &o)) != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        rc = EXIT_RUNTIME;
        goto done;
    }
    if (o.save_weights) {
        if ((st = ebb_model_save(m, o.save_weights)) != EBB_OK) {
            fprintf(stderr, "ebb: %s\n", ebb_errmsg());
            rc = EXIT_RUNTIME;
            goto done;
        }
        if (!o.json)
            printf("weights written to %s\n", o.save_weights);
    }
    if (curve && !o.json)
        printf("learning curves drawn in %s\n", o.curve);
done:
    if (sig_installed)
        sigaction(SIGINT, &old_sa, NULL);
    ebb_file_abort(tw);
    ebb_cli_curve_free(curve);
    free_batch(ts, MAX_FIELDS);
    free(order);
    ebb_optimizer_free(opt);
    ebb_model_free(m);
    ebb_dataset_free(train);
    ebb_dataset_free(test);
    ebb_plan_free(plan);
    ebb_plan_free(infer);
    ebb_spec_free(j.spec);
    return rc;
}

/* ---- eval ------------------------------------------------------------------ */

int ebb_cli_eval(int argc, char **argv) {
    topts o;
    int rc = parse(argc, argv, 0, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    job j;
    ebb_plan *plan = NULL;
    ebb_model *m = NULL;
    ebb_dataset *d = NULL;
    ebb_status st;
    if ((rc = load_job(&j, &o)) || (rc = compile_plan(&j, o.batch, NULL, 0, &plan)) ||
        (rc = open_data(&j, &o, o.data, plan, &d)))
        goto done;
    if ((st = ebb_model_new(&m, plan, j.dev, 0)) != EBB_OK ||
        (st = ebb_model_load(m, o.weights)) != EBB_OK) {
        rc = ebb_cli_fail_status(st);
        goto done;
    }
    double loss = 0, acc = 0;
    if ((st = evaluate(&j, plan, m, d, o.batch, &loss, &acc)) != EBB_OK) {
        rc = ebb_cli_fail_status(ebb_spec_annotate_error(j.spec, st));
        goto done;
    }
    long long n = (long long)ebb_dataset_size(d);
    if (o.json) {
        printf("{\"samples\": %lld, \"loss\": %.9g", n, loss);
        if (j.classify)
            printf(", \"accuracy\": %.9g", acc);
        printf("}\n");
    } else if (j.classify) {
        printf("accuracy %.4f loss %.4f on %lld samples\n", acc, loss, n);
    } else {
        printf("loss %.4f on %lld samples\n", loss, n);
    }
done:
    ebb_model_free(m);
    ebb_dataset_free(d);
    ebb_plan_free(plan);
    ebb_spec_free(j.spec);
    return rc;
}
