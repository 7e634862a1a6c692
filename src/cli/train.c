/* `ebb train` and `ebb eval`: a spec trained on a dataset (include/ebb/data.h)
 * with its training plan, checkpointed, resumed, and evaluated.
 *
 * Training never loses work: a step whose loss is not finite stops the run
 * before anything is written (or, with --skip-nonfinite, is undone and
 * counted); no checkpoint or weights file is written with NaN or Inf in it;
 * a resumed run takes nothing from the command line that contradicts its
 * checkpoint; and SIGINT, SIGTERM or SIGHUP end it with a checkpoint.
 *
 * Exit codes as the rest of the command: 0 ok, 1 spec or data error (a loss
 * or a state that is not finite included), 2 usage error, 3 runtime error;
 * 128 + the signal when SIGINT (130), SIGTERM (143) or SIGHUP (129) stopped
 * training, after the step under way finished and a checkpoint was written. */
#define _GNU_SOURCE /* getopt_long */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ebb/ebb.h"
#include "ebb/data.h"
#include "ebb/safetensors.h"
#include "ebb/spec.h"
#include "../fileio.h"
#include "curve.h"
#include "train.h"

enum { EXIT_SPEC = 1, EXIT_USAGE = 2, EXIT_RUNTIME = 3, EXIT_SIGNAL_BASE = 128 };

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
    "                 [--optimizer KIND] [--lr X] [--lr-schedule S] [--momentum X]\n"
    "                 [--weight-decay X] [--loss NAME]\n"
    "                 [--seed N] [--no-shuffle] [--drop-last] [--normalize MEAN,STD]\n"
    "                 [--weights W] [--save-weights W] [--checkpoint FILE]\n"
    "                 [--checkpoint-every N] [--resume CKPT] [--log-every N]\n"
    "                 [--curve FILE.svg] [--trace T.jsonl [--trace-step N]]\n"
    "                 [--memory-budget SIZE] [--skip-nonfinite] [--allow-nonfinite]\n"
    "                 [--override] [--non-strict] [--strict-memory] [--cuda-graph]\n"
    "                 [--device DEV] [--json] [-p NAME=VALUE]...\n"
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
    "  --optimizer KIND   sgd, adam, adamw, rmsprop, adagrad or adadelta (default adamw),\n"
    "                     with torch.optim's defaults\n"
    "  --lr X             learning rate (default 1e-3; sgd needs one)\n"
    "  --lr-schedule S    change the rate after every step as torch.optim.lr_scheduler\n"
    "                     does: step:SIZE[:GAMMA], multistep:M1,M2[:GAMMA],\n"
    "                     exponential:GAMMA, cosine:T_MAX[:ETA_MIN],\n"
    "                     linear:ITERS[:START[:END]], warmup-cosine:WARMUP:TOTAL,\n"
    "                     onecycle:MAX_LR:TOTAL[:PCT] (steps, not epochs); kept in\n"
    "                     checkpoints and resumed where it was\n"
    "  --momentum X       sgd's momentum (default 0)\n"
    "  --loss NAME        this loss op instead of the spec's `loss:` (as for plan and grad)\n"
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
    "  --resume CKPT      continue from a checkpoint: weights, optimizer state, step;\n"
    "                     --checkpoint may name the same file\n"
    "  --override         with --resume: --optimizer, --lr, --momentum, --weight-decay,\n"
    "                     --seed, --batch, --no-shuffle and --drop-last that contradict\n"
    "                     the checkpoint win (else that is an error)\n"
    "  --non-strict       with --resume: a trained parameter the checkpoint holds no\n"
    "                     optimizer state for starts without (else an error)\n"
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
    "                     recomputing activations in the backward; same updates\n"
    "  --skip-nonfinite   undo and count a step whose loss (or updated state) is NaN or\n"
    "                     infinite, as torch's GradScaler skips one; else such a step\n"
    "                     stops training (exit 1) with nothing written\n"
    "  --allow-nonfinite  NaN or Inf in --weights or --resume is a warning, not an "
    "error\n"
    "  --strict-memory    a step that measures more than its plan promised stops training\n"
    "                     (exit 3, nothing written), rather than a warning\n"
    "  --cuda-graph       on a CUDA device, capture the training step (forward, loss,\n"
    "                     backward, updates) into a CUDA graph at the first full batch\n"
    "                     and replay it for every full batch after; the same updates,\n"
    "                     much less launch time for small models (a last partial batch\n"
    "                     and a traced step run eagerly)\n" USAGE_COMMON "\n"
    "SIGINT (Ctrl-C), SIGTERM and SIGHUP finish the step under way, write a checkpoint\n"
    "and exit 128 + the signal (130, 143, 129); a second signal stops at once.\n";

const char ebb_cli_usage_eval[] =
    "usage: ebb eval SPEC --weights W --data D [--batch B] [--device DEV] [--json]\n"
    "                [--normalize MEAN,STD] [--allow-nonfinite] [-p NAME=VALUE]...\n"
    "\n"
    "Runs the spec's inference plan over a dataset (as `ebb train --data`) and prints\n"
    "'accuracy 0.8912 loss 0.3123 on 10000 samples' for a cross_entropy or nll spec,\n"
    "else 'loss X on N samples' (the loss op with its default options).\n"
    "\n"
    "  --weights W        the trained weights (required)\n"
    "  --data D           the data (required)\n"
    "  --batch B          samples per run (default 256)\n"
    "  --normalize MEAN,STD\n"
    "                     as for ebb train\n"
    "  --allow-nonfinite  NaN or Inf in --weights is a warning, not an error\n" USAGE_COMMON;

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
    O_SKIP_NONFINITE,
    O_ALLOW_NONFINITE,
    O_OVERRIDE,
    O_NON_STRICT,
    O_STRICT_MEMORY,
    O_CUDA_GRAPH,
    O_LR_SCHEDULE,
    O_LOSS,
};

#define COMMON_LONGS                                                                               \
    {"help", no_argument, NULL, 'h'}, {"completion-helper", no_argument, NULL, O_COMPLETION},      \
        {"device", required_argument, NULL, O_DEVICE}, {"json", no_argument, NULL, O_JSON},        \
        {"normalize", required_argument, NULL, O_NORMALIZE},                                       \
        {"data", required_argument, NULL, O_DATA}, {"batch", required_argument, NULL, O_BATCH},    \
        {"weights", required_argument, NULL, O_WEIGHTS}, {                                         \
        "allow-nonfinite", no_argument, NULL, O_ALLOW_NONFINITE                                    \
    }

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
    {"skip-nonfinite", no_argument, NULL, O_SKIP_NONFINITE},
    {"override", no_argument, NULL, O_OVERRIDE},
    {"non-strict", no_argument, NULL, O_NON_STRICT},
    {"strict-memory", no_argument, NULL, O_STRICT_MEMORY},
    {"cuda-graph", no_argument, NULL, O_CUDA_GRAPH},
    {"lr-schedule", required_argument, NULL, O_LR_SCHEDULE},
    {"loss", required_argument, NULL, O_LOSS},
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
    int skip_nonfinite, allow_nonfinite, override, non_strict, strict_memory, cuda_graph;
    const char *lr_schedule; /* --lr-schedule, parsed into sched */
    const char *loss;        /* --loss: instead of the spec's */
    ebb_lr_schedule sched;
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
            if (ebb_optimizer_kind_parse(NULL, v) != EBB_OK)
                return ebb_cli_usage_error(usage, "--optimizer: %s", ebb_errmsg());
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
        case O_SKIP_NONFINITE:
            o->skip_nonfinite = 1;
            break;
        case O_STRICT_MEMORY:
            o->strict_memory = 1;
            break;
        case O_CUDA_GRAPH:
            o->cuda_graph = 1;
            break;
        case O_LOSS: o->loss = v; break;
        case O_LR_SCHEDULE:
            if (ebb_lr_schedule_parse(&o->sched, v) != EBB_OK)
                return ebb_cli_usage_error(usage, "--lr-schedule: %s", ebb_errmsg());
            o->lr_schedule = v;
            break;
        case O_ALLOW_NONFINITE:
            o->allow_nonfinite = 1;
            break;
        case O_OVERRIDE:
            o->override = 1;
            break;
        case O_NON_STRICT:
            o->non_strict = 1;
            break;
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
            return ebb_cli_unknown_option(usage, longs, argv[optind - 1]);
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
    if (train && o->momentum_set && o->optimizer && strcmp(o->optimizer, "sgd") &&
        strcmp(o->optimizer, "rmsprop"))
        return ebb_cli_usage_error(usage, "%s", "--momentum applies to --optimizer sgd and rmsprop");
    if (train && o->momentum_set && !o->optimizer && !o->resume)
        return ebb_cli_usage_error(usage, "%s",
                                   "--momentum applies to --optimizer sgd and rmsprop (default "
                                   "adamw)");
    if (train && o->optimizer && !strcmp(o->optimizer, "sgd") && !o->lr_set && !o->resume)
        return ebb_cli_usage_error(usage, "%s", "--optimizer sgd needs --lr");
    if (train && (o->override || o->non_strict) && !o->resume)
        return ebb_cli_usage_error(usage, "%s",
                                   o->override
                                       ? "--override applies to --resume, which is not given"
                                       : "--non-strict applies to --resume, which is not given");
    if (train && o->cuda_graph && o->skip_nonfinite)
        return ebb_cli_usage_error(usage, "%s",
                                   "--cuda-graph and --skip-nonfinite cannot be combined: a "
                                   "replayed step cannot be undone (its updates are in the graph)");
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
    if (o->cuda_graph && j->dev.type != EBB_DEVICE_CUDA) {
        char d[32];
        fprintf(stderr, "ebb: --cuda-graph needs a CUDA device; training would run on %s "
                        "(add --device cuda)\n",
                ebb_device_str(j->dev, d, sizeof d));
        return EXIT_USAGE;
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
                        int64_t budget, const char *loss, ebb_plan **out) {
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
                                 .optimizer = *optim,
                                 .loss = loss};
        co.train = &to;
        co.memory_budget = budget;
    }
    ebb_status st = ebb_spec_compile(out, j->spec, &co);
    return st == EBB_OK ? 0 : ebb_cli_fail_status(st);
}

static int open_data(const job *j, const topts *o, const char *desc, const ebb_plan *infer,
                     ebb_dataset **out) {
    /* the spec's shapes, checked against the files' headers before any data
     * is read (a file of the wrong shape costs its header, not its size) */
    ebb_shape in[MAX_FIELDS], tg[MAX_FIELDS], want[2 * MAX_FIELDS];
    int rc = batch_shapes(j, 1, in, tg);
    if (rc)
        return rc;
    for (int i = 0; i < j->n_fields; i++)
        want[i] = i < j->n_in ? in[i] : tg[i - j->n_in];
    ebb_dataset_expect expect = {.shapes = want, .n_shapes = j->n_fields};
    /* and no more data than this process can still get: a small gzip file
     * that declares gigabytes is refused from its header */
    ebb_fit fit = {.available_bytes = -1};
    if (infer && ebb_plan_check_fits(infer, ebb_device_cpu(), NULL, 0, &fit) != EBB_OK)
        ebb_error_clear(); /* the plan's own fit is checked where it runs */
    if (fit.available_bytes > 0)
        expect.max_bytes = fit.available_bytes;
    ebb_status st = ebb_dataset_open_ex(out, desc, j->names, j->n_fields, &expect);
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

/* ---- the model and its optimizer state ------------------------------------- */

/* the optimizer's state slots (ebb_optimizer_state_slot) */
#define N_SLOTS 8
#define PER_PARAM (1 + N_SLOTS) /* a parameter, then its optimizer state slots */
#define slot_names(k) ebb_optimizer_state_slot(NULL, (k))

/* Whether options `o` keep state slot k (ebb_optimizer_save()'s names). */
static int slot_used(const ebb_optimizer_options *o, int k) {
    const char *name = ebb_optimizer_state_slot(o, k);
    return name && *name;
}

static const char *kind_name(ebb_optimizer_kind k) { return ebb_optimizer_kind_name(k); }

/* What a checkpoint holds of the model and its optimizer: every parameter,
 * its optimizer state (NULL where it has none) and its update count. Either
 * borrowed from the live model and optimizer (state_view), or copies of
 * them (state_copy: the undo of --skip-nonfinite). */
typedef struct state {
    int n, owned;
    ebb_tensor **t; /* [i * PER_PARAM]: parameter i; [i * PER_PARAM + 1 + k]: its slot k */
    int64_t *steps; /* [i]: parameter i's updates */
} state;

static void state_free(state *s) {
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
    state_free(s);
    return ebb_error_set(EBB_ERR_NOMEM, "out of memory");
}

static ebb_status state_view(state *s, const ebb_model *m, const ebb_optimizer *opt) {
    ebb_status st = state_alloc(s, ebb_model_param_count(m), 0);
    for (int i = 0; st == EBB_OK && i < s->n; i++) {
        s->t[i * PER_PARAM] = ebb_model_param(m, ebb_model_param_name(m, i));
        for (int k = 0; k < N_SLOTS; k++)
            s->t[i * PER_PARAM + 1 + k] = ebb_optimizer_state_tensor(opt, i, slot_names(k));
        s->steps[i] = ebb_optimizer_param_step_count(opt, i);
    }
    return st;
}

/* s becomes a copy of the live state, reusing the tensors of its last copy. */
static ebb_status state_copy(state *s, const ebb_model *m, const ebb_optimizer *opt) {
    state live = {0};
    ebb_status st = state_view(&live, m, opt);
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
    state_free(&live);
    return st;
}

/* Writes s to `path`: the parameters under their names when with_params;
 * the optimizer state as ebb_optimizer_save() names it, under options oo (a
 * slot oo does not keep is left out, and so is all of a parameter's state
 * when it lacks a slot oo keeps: it starts afresh, as torch.optim's would);
 * and n_meta metadata pairs. */
static ebb_status state_write(const state *s, const ebb_model *m, const ebb_optimizer_options *oo,
                              const char *path, int with_params, const char *const *meta,
                              int n_meta) {
    int cap = s->n * (PER_PARAM + 1) + 1, n = 0;
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
            whole &= !slot_used(oo, k) || slot[k] != NULL;
        for (int k = 0; whole && st == EBB_OK && k <= N_SLOTS; k++) {
            if (k < N_SLOTS && !slot_used(oo, k)) continue;
            size_t len = strlen(pn) + 32;
            if ((names[n] = malloc(len)))
                snprintf(names[n], len, "optim.%s.%s", pn, k < N_SLOTS ? slot_names(k) : "step");
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
        double v[15] = {2,
                        (double)oo->kind,
                        oo->lr,
                        oo->momentum,
                        oo->dampening,
                        oo->nesterov,
                        oo->weight_decay,
                        oo->beta1,
                        oo->beta2,
                        oo->eps,
                        oo->amsgrad,
                        oo->rho,
                        oo->centered,
                        oo->lr_decay,
                        oo->initial_accumulator_value};
        ebb_shape sh = {1, {15}};
        names[n] = strdup("optim.options");
        made[n] = 1;
        st = ebb_tensor_from_host(&ts[n++], v, sizeof v, &sh, EBB_FLOAT64, ebb_device_cpu());
    }
    for (int i = 0; st == EBB_OK && i < n; i++)
        if (!names[i])
            st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK)
        st = ebb_safetensors_write_meta(path, (const char *const *)names, ts, n, meta, n_meta);
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

/* Replaces the optimizer's state and update counts with s's, under options
 * oo, through an anonymous file in memory: ebb_optimizer_load() is the one
 * call that sets them. */
static ebb_status state_load_optimizer(const state *s, const ebb_model *m, ebb_optimizer *opt,
                                       const ebb_optimizer_options *oo) {
    int fd = memfd_create("ebb-optimizer-state", MFD_CLOEXEC);
    if (fd < 0)
        return ebb_error_set(EBB_ERR_IO, "cannot hold the optimizer state in memory: %s",
                             strerror(errno));
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ebb_status st = state_write(s, m, oo, path, 0, NULL, 0);
    if (st == EBB_OK) st = ebb_optimizer_load(opt, path);
    close(fd);
    return st;
}

/* Puts a copy back: the parameters (batch_norm's running statistics among
 * them), the optimizer's state and its update counts. */
static ebb_status state_restore(const state *s, ebb_model *m, ebb_optimizer *opt) {
    ebb_status st = EBB_OK;
    for (int i = 0; st == EBB_OK && i < s->n; i++)
        st = ebb_tensor_copy_(ebb_model_param(m, ebb_model_param_name(m, i)), s->t[i * PER_PARAM]);
    ebb_optimizer_options oo = ebb_optimizer_get_options(opt);
    return st == EBB_OK ? state_load_optimizer(s, m, opt, &oo) : st;
}

/* The NaN and infinite elements of t (none in an integer tensor). */
static ebb_status count_nonfinite(const ebb_tensor *t, int64_t *bad) {
    ebb_dtype dt = ebb_tensor_dtype(t);
    *bad = 0;
    if (dt != EBB_FLOAT32 && dt != EBB_FLOAT64 && dt != EBB_FLOAT16 && dt != EBB_BFLOAT16)
        return EBB_OK;
    int wide = dt == EBB_FLOAT64;
    size_t n = (size_t)ebb_tensor_numel(t), size = n * (wide ? sizeof(double) : sizeof(float));
    ebb_tensor *h = NULL;
    ebb_status st = ebb_tensor_to(&h, t, ebb_device_cpu(), wide ? EBB_FLOAT64 : EBB_FLOAT32);
    void *buf = st == EBB_OK ? malloc(size + 1) : NULL;
    if (st == EBB_OK && !buf) st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    if (st == EBB_OK) st = ebb_tensor_to_host(h, buf, size);
    for (size_t i = 0; st == EBB_OK && i < n; i++)
        *bad += wide ? !isfinite(((const double *)buf)[i]) : !isfinite(((const float *)buf)[i]);
    free(buf);
    ebb_tensor_free(h);
    return st;
}

/* EBB_ERR_ARG naming the first tensor of s (parameters only, or with the
 * optimizer state) that holds NaN or Inf; or, when warn_file is given,
 * one warning per such tensor and EBB_OK. */
static ebb_status state_check_finite(const state *s, const ebb_model *m, int params_only,
                                     const char *warn_file) {
    for (int k = 0; k < s->n * PER_PARAM; k++) {
        int64_t bad = 0;
        int i = k / PER_PARAM, slot = k % PER_PARAM - 1;
        if (!s->t[k] || (params_only && slot >= 0)) continue;
        ebb_status st = count_nonfinite(s->t[k], &bad);
        if (st != EBB_OK) return st;
        if (!bad) continue;
        char what[512];
        snprintf(what, sizeof what, slot < 0 ? "parameter '%s%s'" : "optimizer state 'optim.%s.%s'",
                 ebb_model_param_name(m, i), slot < 0 ? "" : slot_names(slot));
        if (!warn_file)
            return ebb_error_set(EBB_ERR_ARG, "%s holds %lld NaN or infinite values (of %lld)",
                                 what, (long long)bad, (long long)ebb_tensor_numel(s->t[k]));
        fprintf(stderr, "ebb: warning: %s: %s holds %lld NaN or infinite values (of %lld)\n",
                warn_file, what, (long long)bad, (long long)ebb_tensor_numel(s->t[k]));
    }
    return EBB_OK;
}

/* ---- checkpoints ----------------------------------------------------------- */

typedef struct ckpt_info {
    int64_t step;
    uint64_t seed;
    int64_t batch;
    int shuffle, drop_last;
    ebb_optimizer_options optim;
    char *data;      /* the data it was trained on (data_fields()); NULL: not recorded */
    char *stateless; /* trained parameters without optimizer state, comma-separated; NULL:
                        not recorded (a checkpoint of an older ebb) */
    /* the learning-rate schedule and where it was (ebb_lr_scheduler_restore) */
    int has_schedule;
    ebb_lr_schedule sched;
    int64_t sched_steps;
    double sched_lr, sched_base;
} ckpt_info;

static void ckpt_info_free(ckpt_info *ci) {
    free(ci->data);
    free(ci->stateless);
    memset(ci, 0, sizeof *ci);
}

/* "x float32 [96, 64], y int64 [96]": a dataset's fields as stored, samples
 * first, which a checkpoint records so that a resumed run can tell another
 * dataset. A new string, or NULL when out of memory. */
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

/* The trained parameters that have no optimizer state, comma-separated: a
 * branch no row chose has none, and a resumed run must tell that from state
 * a file lost. A new string ("" for none), or NULL when out of memory. */
static char *stateless_params(const ebb_plan *plan, const ebb_model *m, const ebb_optimizer *opt) {
    size_t cap = 1, at = 0;
    for (int i = 0; i < ebb_model_param_count(m); i++)
        cap += strlen(ebb_model_param_name(m, i)) + 1;
    char *s = malloc(cap);
    for (int i = 0; s && i < ebb_model_param_count(m); i++)
        if (ebb_plan_param_trained(plan, i) && ebb_optimizer_param_step_count(opt, i) <= 0)
            at += (size_t)snprintf(s + at, cap - at, "%s%s", at ? "," : "",
                                   ebb_model_param_name(m, i));
    if (s) s[at] = '\0';
    return s;
}

static int in_list(const char *list, const char *name) {
    size_t len = strlen(name);
    for (const char *p = list; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        if (strcspn(p, ",") == len && !strncmp(p, name, len)) return 1;
    }
    return 0;
}

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
    double v[15] = {0}; /* ebb_optimizer_save()'s optim.options: 15 values, or 11 (version 1) */
    ebb_shape sh;
    ebb_dtype dt;
    if (!ebb_safetensors_metadata(sf, "ebb_checkpoint") || !meta_i64(sf, "step", &ci->step) ||
        !meta_i64(sf, "seed", &seed) || !meta_i64(sf, "batch", &ci->batch) ||
        !meta_i64(sf, "shuffle", &shuffle) || !meta_i64(sf, "drop_last", &drop))
        st = ebb_error_set(EBB_ERR_ARG, "%s: not an ebb train checkpoint (its __metadata__ lacks "
                           "ebb_checkpoint, step, seed, batch, shuffle or drop_last)", path);
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
        ci->sched_lr = lr ? strtod(lr, &end1) : NAN;
        ci->sched_base = base ? strtod(base, &end2) : NAN;
        if (ebb_lr_schedule_parse(&ci->sched, sched) != EBB_OK ||
            !meta_i64(sf, "lr_schedule_steps", &ci->sched_steps) || !end1 || *end1 || !end2 ||
            *end2 || !isfinite(ci->sched_lr) || !isfinite(ci->sched_base))
            st = ebb_error_set(EBB_ERR_ARG, "%s: its learning-rate schedule '%s' is not one ebb "
                               "can resume (lr_schedule_steps, lr_schedule_lr and "
                               "lr_schedule_base must be numbers)", path, sched);
        ci->has_schedule = 1;
    }
    if (st == EBB_OK && ((data && !(ci->data = strdup(data))) ||
                         (stateless && !(ci->stateless = strdup(stateless)))))
        st = ebb_error_set(EBB_ERR_NOMEM, "out of memory");
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
                                        .rho = v[11],
                                        .centered = (int)v[12],
                                        .lr_decay = v[13],
                                        .initial_accumulator_value = v[14],
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

/* ---- train: the trainer and its phases ------------------------------------- */

/* One training run: open (options, spec, plans, data, model, a checkpoint
 * resumed), then per step: step, report, epoch end, checkpoint; then finish
 * (the last checkpoint, the weights) or stop (a signal); close frees it all. */
typedef struct trainer {
    topts o;
    job j;
    const char *ckpt_path, *kind; /* kind: the optimizer's name */
    ebb_optimizer_options oo;
    ckpt_info ci;
    ebb_plan *plan, *infer;
    ebb_model *m;
    ebb_optimizer *opt;
    ebb_dataset *train, *test;
    char *data; /* data_fields(train) */
    int64_t *order;
    ebb_tensor *ts[MAX_FIELDS];
    ebb_file_out *tw; /* --trace, until its step is written */
    ebb_cli_trace trace;
    ebb_cli_curve *curve;
    state undo; /* --skip-nonfinite: the model and optimizer before the step */
    ebb_capture *cap; /* --cuda-graph: the step, captured at the first full batch */
    ebb_lr_scheduler *sched; /* --lr-schedule, or the checkpoint's */
    ebb_lr_schedule sched_spec;
    double step_lr; /* the rate of the step just taken */
    int64_t graph_steps; /* steps replayed from it */
    int tty;
    /* steps are counted from 1, as the log counts them */
    int64_t n, per_epoch, epoch_samples, total, epochs, step, trace_at, window;
    int64_t shuffled_epoch, last_ckpt, planned, measured, done_steps;
    int64_t skipped, first_skipped;
    int64_t over_steps; /* training steps that measured more than their plan */
    char first_skip_why[512];
    double t0, t_epoch, last_draw;
    /* losses summed since the last log line, the epoch's start and the last curve
     * point, over the steps counted (not skipped) */
    double run_loss, epoch_loss, curve_loss;
    int64_t run_n, epoch_n, curve_n, epoch_steps, epoch_skipped;
} trainer;

/* The signal that asked training to stop (0: none). The loop looks at it
 * between steps only, so that a step and a checkpoint are never cut short. */
static volatile sig_atomic_t stop_signal;
static atomic_int stop_count; /* signals received: two may arrive at once, on two threads */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_STOP_SIGNALS 3
static volatile sig_atomic_t stop_installed[N_STOP_SIGNALS];
static struct sigaction stop_old[N_STOP_SIGNALS], stop_default;

static void on_stop_signal(int sig) {
    if (atomic_fetch_add(&stop_count, 1) > 0) {
        /* a second signal stops at once: its default action, once this
         * handler returns and unblocks it, leaving no checkpoint's
         * temporary file behind */
        ebb_file_remove_temporaries();
        sigaction(sig, &stop_default, NULL);
        raise(sig);
        return;
    }
    stop_signal = sig;
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (stop_installed[i]) sigaction(stop_signals[i], &stop_default, NULL);
}

/* A signal ignored when the command started (nohup's SIGHUP, SIGINT in a
 * background job) stays ignored. */
static void signals_install(void) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* what the signal interrupts (a write to a pipe) goes on */
    sigemptyset(&sa.sa_mask);
    stop_default = (struct sigaction){.sa_handler = SIG_DFL};
    sigemptyset(&stop_default.sa_mask);
    stop_signal = 0;
    atomic_store(&stop_count, 0);
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (sigaction(stop_signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            stop_installed[i] = sigaction(stop_signals[i], &sa, &stop_old[i]) == 0;
}

static void signals_restore(void) {
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (stop_installed[i]) {
            sigaction(stop_signals[i], &stop_old[i], NULL);
            stop_installed[i] = 0;
        }
}

static const char *signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "?";
}

/* Samples seen after `step` steps: whole epochs, then the batches of the
 * epoch under way (the last one partial unless --drop-last); -1 when that
 * does not fit in 64 bits. */
static int64_t samples_at(int64_t step, int64_t per_epoch, int64_t epoch_samples, int64_t batch) {
    int64_t whole, in_epoch, s;
    if (__builtin_mul_overflow(step / per_epoch, epoch_samples, &whole) ||
        __builtin_mul_overflow(step % per_epoch, batch, &in_epoch) ||
        __builtin_add_overflow(whole, in_epoch < epoch_samples ? in_epoch : epoch_samples, &s))
        return -1;
    return s;
}

static void fmt_eta(double s, char *buf, size_t size) {
    if (!(s >= 0) || s > 1e7)
        snprintf(buf, size, "?");
    else if (s >= 3600)
        snprintf(buf, size, "%d:%02d:%02d", (int)(s / 3600), (int)(s / 60) % 60, (int)s % 60);
    else
        snprintf(buf, size, "%d:%02d", (int)(s / 60), (int)s % 60);
}

/* A mean loss as a log line prints it: "0.1234" (JSON: "0.123456789"), or,
 * when every step it covers was skipped or the value is not finite, "-"
 * (JSON: null). */
static const char *fmt_loss(double sum, int64_t n, int json, char *buf, size_t size) {
    double v = n ? sum / (double)n : NAN;
    if (isfinite(v))
        snprintf(buf, size, json ? "%.9g" : "%.4f", v);
    else
        snprintf(buf, size, "%s", json ? "null" : "-");
    return buf;
}

/* ---- open ---- */

/* Each option given with --resume that contradicts the checkpoint, into
 * why; returns how many. */
static int resume_conflicts(const topts *o, const ckpt_info *ci, char *why, size_t size) {
    const ebb_optimizer_options *c = &ci->optim;
    size_t at = 0;
    int n = 0;
    why[0] = '\0';
#define CONFLICT(cond, ...)                                                                        \
    if ((cond) && at < size) {                                                                     \
        at += (size_t)snprintf(why + at, size - at, n++ ? "; " : "");                              \
        if (at < size) at += (size_t)snprintf(why + at, size - at, __VA_ARGS__);                   \
    }
    CONFLICT(o->optimizer && strcmp(o->optimizer, kind_name(c->kind)),
             "--optimizer %s, the checkpoint's is %s", o->optimizer, kind_name(c->kind));
    CONFLICT(o->lr_set && o->lr != c->lr, "--lr %g, the checkpoint's is %g", o->lr, c->lr);
    CONFLICT(o->momentum_set && o->momentum != c->momentum, "--momentum %g, the checkpoint's is %g",
             o->momentum, c->momentum);
    CONFLICT(o->wd_set && o->weight_decay != c->weight_decay,
             "--weight-decay %g, the checkpoint's is %g", o->weight_decay, c->weight_decay);
    CONFLICT(o->seed_set && o->seed != ci->seed, "--seed %llu, the checkpoint's is %llu",
             (unsigned long long)o->seed, (unsigned long long)ci->seed);
    CONFLICT(o->batch_set && o->batch != ci->batch, "--batch %lld, the checkpoint's is %lld",
             (long long)o->batch, (long long)ci->batch);
    CONFLICT(o->no_shuffle && ci->shuffle, "--no-shuffle, the checkpoint shuffles");
    CONFLICT(o->drop_last && !ci->drop_last,
             "--drop-last, the checkpoint keeps the last partial batch");
    char have[256], had[256];
    CONFLICT(o->lr_schedule && (!ci->has_schedule || memcmp(&o->sched, &ci->sched, sizeof o->sched)),
             "--lr-schedule %s, the checkpoint's is %s", ebb_lr_schedule_str(&o->sched, have, sizeof have),
             ci->has_schedule ? ebb_lr_schedule_str(&ci->sched, had, sizeof had) : "none");
#undef CONFLICT
    return n;
}

/* The optimizer and the data order: the command line's, or with --resume
 * the checkpoint's, which an option that contradicts it may not change
 * unless --override says so. */
static int resolve_options(trainer *t) {
    topts *o = &t->o;
    ebb_optimizer_kind k = EBB_ADAMW;
    if (o->optimizer) ebb_optimizer_kind_parse(&k, o->optimizer); /* checked by parse() */
    t->oo = ebb_optimizer_defaults(k, o->lr_set ? o->lr : ebb_optimizer_default_lr(k));
    if (o->resume) {
        ebb_status st = read_checkpoint_info(o->resume, &t->ci);
        if (st != EBB_OK) return ebb_cli_fail_status(st);
        char why[2048];
        if (resume_conflicts(o, &t->ci, why, sizeof why) && !o->override) {
            fprintf(stderr, "ebb: --resume %s: %s (--override makes the command line win)\n",
                    o->resume, why);
            return EXIT_USAGE;
        }
        o->seed = o->seed_set ? o->seed : t->ci.seed;
        o->batch = o->batch_set ? o->batch : t->ci.batch;
        o->no_shuffle |= !t->ci.shuffle;
        o->drop_last |= t->ci.drop_last;
        if (!o->optimizer || k == t->ci.optim.kind)
            t->oo = t->ci.optim;
        else if (!o->lr_set)
            t->oo.lr = t->ci.optim.lr;
        if (o->lr_set) t->oo.lr = o->lr;
    }
    if (o->momentum_set && t->oo.kind != EBB_SGD && t->oo.kind != EBB_RMSPROP) {
        fprintf(stderr, "ebb: --momentum applies to --optimizer sgd and rmsprop; %s trains with %s\n",
                o->resume ? o->resume : "the run", kind_name(t->oo.kind));
        return EXIT_USAGE;
    }
    if (o->momentum_set) t->oo.momentum = o->momentum;
    if (o->wd_set) t->oo.weight_decay = o->weight_decay;
    t->kind = kind_name(t->oo.kind);
    return 0;
}


static void add_file(const char **list, int *n, const char *role, const char *what,
                     const char *path) {
    list[(*n)++] = role;
    list[(*n)++] = what;
    list[(*n)++] = path;
}

/* Once before anything is read, once more with the data's files. */
static int check_files(const trainer *t) {
    const topts *o = &t->o;
    const char *list[3 * (16 + 2 * MAX_FIELDS) + 1];
    int n = 0;
    add_file(list, &n, "in", "SPEC", o->spec);
    add_file(list, &n, "in", "--weights", o->weights);
    add_file(list, &n, "in", "--resume", o->resume);
    for (int i = 0; i < ebb_dataset_field_count(t->train) && i < MAX_FIELDS; i++)
        add_file(list, &n, "in", "--data", ebb_dataset_field_file(t->train, i));
    for (int i = 0; i < ebb_dataset_field_count(t->test) && i < MAX_FIELDS; i++)
        add_file(list, &n, "in", "--eval-data", ebb_dataset_field_file(t->test, i));
    /* the checkpoint resumed is read whole before the first is written */
    add_file(list, &n, "out=--resume", "--checkpoint", t->ckpt_path);
    add_file(list, &n, "out", "--save-weights", o->save_weights);
    add_file(list, &n, "out", "--trace", o->trace);
    add_file(list, &n, "out", "--curve", o->curve);
    list[n] = NULL;
    return ebb_cli_check_aliases(list);
}

static void warn_nonfinite(const char *path, const char *name, int64_t count, int64_t numel,
                           void *user) {
    (void)user;
    fprintf(stderr,
            "ebb: warning: %s: parameter '%s' holds %lld NaN or infinite values (of %lld)\n", path,
            name, (long long)count, (long long)numel);
}

/* Loads `path` into m; NaN or Inf in it is an error naming the tensor unless
 * `allow`, which makes it a warning. */
static int load_weights(ebb_model *m, const char *path, int allow) {
    ebb_model_load_options lo = {.strict_finite = !allow, .nonfinite = warn_nonfinite};
    ebb_status st = ebb_model_load_ex(m, path, &lo);
    if (st == EBB_OK) return 0;
    if (st == EBB_ERR_ARG && strstr(ebb_errmsg(), "NaN or infinite")) {
        fprintf(stderr, "ebb: %s; --allow-nonfinite loads it anyway\n", ebb_errmsg());
        return EXIT_SPEC;
    }
    return ebb_cli_fail_status(st);
}

/* With --resume: a trained parameter without optimizer state, unless the
 * checkpoint says it had none, is state the file lost; resuming would
 * restart it from zero. */
static int check_missing_state(const trainer *t) {
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
            at +=
                (size_t)snprintf(names + at, sizeof names - at, "%s'%s'", missing ? ", " : "", pn);
        missing++;
    }
    if (!missing) return 0;
    fprintf(stderr, "ebb: %s%s: no optimizer state for %s, which %s trained at step %lld%s\n",
            t->o.non_strict ? "warning: " : "", t->o.resume, names, missing > 1 ? "were" : "was",
            (long long)t->ci.step,
            t->o.non_strict ? "; --non-strict: starting without it"
                            : "; --non-strict starts without it");
    return t->o.non_strict ? 0 : EXIT_SPEC;
}

static int same_options(const ebb_optimizer_options *a, const ebb_optimizer_options *b) {
    return a->kind == b->kind && a->lr == b->lr && a->momentum == b->momentum &&
           a->dampening == b->dampening && a->nesterov == b->nesterov &&
           a->weight_decay == b->weight_decay && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
           a->eps == b->eps && a->amsgrad == b->amsgrad && a->rho == b->rho &&
           a->centered == b->centered && a->lr_decay == b->lr_decay &&
           a->initial_accumulator_value == b->initial_accumulator_value;
}

/* --resume: the weights, the optimizer state (under the options in force,
 * which --override may have changed), each checked for state lost and for
 * NaN or Inf; a dataset unlike the checkpoint's is a warning. */
static int resume(trainer *t) {
    const char *ck = t->o.resume;
    int same_kind = t->oo.kind == t->ci.optim.kind, rc = 0;
    ebb_status st = load_checkpoint_weights(ck, t->m);
    if (st == EBB_OK && same_kind) st = ebb_optimizer_load(t->opt, ck);
    state s = {0};
    if (st == EBB_OK) st = state_view(&s, t->m, t->opt);
    if (st == EBB_OK && same_kind && !same_options(&t->oo, &t->ci.optim)) {
        st = state_load_optimizer(&s, t->m, t->opt, &t->oo);
        state_free(&s); /* it borrowed the state the load replaced */
        if (st == EBB_OK) st = state_view(&s, t->m, t->opt);
    }
    if (st == EBB_OK) st = state_check_finite(&s, t->m, 0, t->o.allow_nonfinite ? ck : NULL);
    state_free(&s);
    if (st == EBB_ERR_ARG && strstr(ebb_errmsg(), "NaN or infinite")) {
        fprintf(stderr, "ebb: %s: %s; --allow-nonfinite loads it anyway\n", ck, ebb_errmsg());
        return EXIT_SPEC;
    }
    if (st != EBB_OK) return ebb_cli_fail_status(st);
    if (!same_kind)
        fprintf(stderr,
                "ebb: warning: --override --optimizer %s: the %s state in %s is not used; "
                "%s starts without state\n",
                t->kind, kind_name(t->ci.optim.kind), ck, t->kind);
    else if ((rc = check_missing_state(t)))
        return rc;
    if (t->ci.data && t->data && strcmp(t->ci.data, t->data))
        fprintf(stderr,
                "ebb: warning: --data %s is not the data %s was trained on: %s now, %s "
                "then\n",
                t->o.data, ck, t->data, t->ci.data);
    return 0;
}

static int open_model(trainer *t) {
    ebb_status st;
    int rc;
    if ((st = ebb_model_new(&t->m, t->plan, t->j.dev, t->o.seed)) != EBB_OK)
        return ebb_cli_fail_status(st);
    if (t->o.weights && (rc = load_weights(t->m, t->o.weights, t->o.allow_nonfinite))) return rc;
    if ((st = ebb_optimizer_new(&t->opt, t->m, &t->oo)) != EBB_OK) return ebb_cli_fail_status(st);
    return t->o.resume ? resume(t) : 0;
}

/* The learning-rate schedule: --lr-schedule's, or on --resume the
 * checkpoint's, continued from where it stopped (a different one, with
 * --override, starts afresh from the checkpoint's rate). */
static int open_schedule(trainer *t) {
    const topts *o = &t->o;
    const ebb_lr_schedule *s = o->lr_schedule ? &o->sched : t->ci.has_schedule ? &t->ci.sched : NULL;
    if (!s) return 0;
    int resumed = t->ci.has_schedule && !memcmp(s, &t->ci.sched, sizeof *s);
    char text[256];
    if (s->kind == EBB_LR_ONE_CYCLE && s->total_steps < t->total) {
        fprintf(stderr, "ebb: --lr-schedule %s ends after step %lld; this run takes %lld steps\n",
                ebb_lr_schedule_str(s, text, sizeof text), (long long)s->total_steps,
                (long long)t->total);
        return EXIT_USAGE;
    }
    t->sched_spec = *s;
    ebb_status st = ebb_lr_scheduler_new(&t->sched, t->opt, s);
    if (st == EBB_OK && resumed)
        st = ebb_lr_scheduler_restore(t->sched, t->ci.sched_steps, t->ci.sched_lr,
                                      t->ci.sched_base);
    if (st != EBB_OK) {
        fprintf(stderr, "ebb: --lr-schedule %s: %s\n", ebb_lr_schedule_str(s, text, sizeof text),
                ebb_errmsg());
        return EXIT_USAGE;
    }
    return 0;
}

/* Steps per epoch, the run's last step and the step it starts from, with
 * their arithmetic checked: a checkpoint's step comes from a file. */
static int plan_steps(trainer *t) {
    const topts *o = &t->o;
    t->n = ebb_dataset_size(t->train);
    if (o->drop_last && t->n < o->batch) {
        fprintf(stderr, "ebb: --drop-last with --batch %lld leaves no step: %s has %lld samples\n",
                (long long)o->batch, o->data, (long long)t->n);
        return EXIT_USAGE;
    }
    t->per_epoch = o->drop_last ? t->n / o->batch : t->n / o->batch + (t->n % o->batch != 0);
    t->epoch_samples = o->drop_last ? t->per_epoch * o->batch : t->n;
    t->step = t->ci.step;
    if (o->steps) t->total = o->steps;
    if ((!o->steps && __builtin_mul_overflow(o->epochs, t->per_epoch, &t->total)) ||
        samples_at(t->total, t->per_epoch, t->epoch_samples, o->batch) < 0) {
        fprintf(stderr, "ebb: %s %lld, %lld steps per epoch, batch %lld: the run's sample count "
                "overflows 64 bits\n",
                o->steps ? "--steps" : "--epochs", (long long)(o->steps ? o->steps : o->epochs),
                (long long)t->per_epoch, (long long)o->batch);
        return EXIT_USAGE;
    }
    if (t->step > t->total) {
        fprintf(stderr,
                "ebb: %s is at step %lld, past the %lld steps of %s %lld: nothing to "
                "train (ask for more steps)\n",
                o->resume, (long long)t->step, (long long)t->total,
                o->steps ? "--steps" : "--epochs", (long long)(o->steps ? o->steps : o->epochs));
        return EXIT_SPEC;
    }
    t->epochs = t->total / t->per_epoch + (t->total % t->per_epoch != 0);
    /* the step --trace traces, counted as the log counts them (from 1) */
    t->trace_at = o->trace_step ? o->trace_step : t->step < t->total ? t->step + 1 : t->total;
    if (o->trace && (t->trace_at <= t->step || t->trace_at > t->total)) {
        fprintf(stderr, "ebb: --trace-step %lld: this run takes steps %llu to %lld\n",
                (long long)t->trace_at, (unsigned long long)t->step + 1, (long long)t->total);
        return EXIT_USAGE;
    }
    /* --curve: a training-loss point per logged window, else about 200
     * points over the run, which a picture 700 px wide still shows apart */
    int64_t left = t->total - t->step;
    t->window = o->log_every ? o->log_every : left / 200 + (left % 200 != 0);
    if (t->window < 1) t->window = 1;
    t->last_ckpt = -1;
    t->shuffled_epoch = -1;
    return 0;
}

/* --trace's writer, --curve's picture and the order of samples. */
static int open_outputs(trainer *t) {
    const topts *o = &t->o;
    ebb_status st;
    if (!(t->order = malloc(sizeof *t->order * (size_t)t->n)))
        return ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
    if (o->trace) {
        if (ebb_file_begin(&t->tw, o->trace, "--trace") != EBB_OK) {
            fprintf(stderr, "ebb: %s\n", ebb_errmsg());
            return EXIT_RUNTIME;
        }
        t->trace = (ebb_cli_trace){.f = ebb_file_stream(t->tw), .plan = t->plan};
    }
    if (!o->curve) return 0;
    char context[1024];
    snprintf(context, sizeof context, "%s on %s, batch %lld, %s lr %g", ebb_spec_file(t->j.spec),
             o->data, (long long)o->batch, t->kind, ebb_optimizer_get_options(t->opt).lr);
    const char *name = ebb_spec_name(t->j.spec);
    ebb_cli_curve_info info = {
        .name = name && *name ? name : ebb_spec_file(t->j.spec),
        .context = context,
        .samples_per_epoch = t->epoch_samples,
        .first_samples = samples_at(t->step, t->per_epoch, t->epoch_samples, o->batch),
        .last_samples = samples_at(t->total, t->per_epoch, t->epoch_samples, o->batch),
        .window = t->window,
        .eval = t->test != NULL,
        .accuracy = t->test && t->j.classify,
    };
    if ((st = ebb_cli_curve_new(&t->curve, &info)) != EBB_OK) return ebb_cli_fail_status(st);
    return 0;
}

/* Returns 0, -1 when help was printed, or an exit code. */
static int trainer_open(trainer *t, int argc, char **argv) {
    topts *o = &t->o;
    int rc = parse(argc, argv, 1, o);
    if (rc) return rc;
    t->ckpt_path = o->checkpoint ? o->checkpoint : DEFAULT_CHECKPOINT;
    if ((o->save_weights && ebb_file_check_writable(o->save_weights, "--save-weights") != EBB_OK) ||
        (o->trace && ebb_file_check_writable(o->trace, "--trace") != EBB_OK) ||
        (o->curve && ebb_file_check_writable(o->curve, "--curve") != EBB_OK) ||
        (o->checkpoint && ebb_file_check_writable(o->checkpoint, "--checkpoint") != EBB_OK)) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    if ((rc = check_files(t)) || (rc = load_job(&t->j, o)) || (rc = resolve_options(t)) ||
        (rc = compile_plan(&t->j, o->batch, &t->oo, o->memory_budget, o->loss, &t->plan)) ||
        (rc = compile_plan(&t->j, o->batch, NULL, 0, NULL, &t->infer)) ||
        (rc = open_data(&t->j, o, o->data, t->infer, &t->train)) ||
        (o->eval_data && (rc = open_data(&t->j, o, o->eval_data, t->infer, &t->test))) ||
        (rc = check_files(t)))
        return rc;
    if (!(t->data = data_fields(t->train)))
        return ebb_cli_fail_status(ebb_error_set(EBB_ERR_NOMEM, "out of memory"));
    if ((rc = open_model(t)) || (rc = plan_steps(t)) || (rc = open_schedule(t)) ||
        (rc = open_outputs(t)))
        return rc;
    t->tty = !o->json && isatty(1);
    t->planned = ebb_plan_device_peak_bytes(t->plan, t->j.dev);
    return 0;
}

static void trainer_close(trainer *t) {
    signals_restore();
    ebb_file_abort(t->tw);
    ebb_cli_curve_free(t->curve);
    free_batch(t->ts, MAX_FIELDS);
    free(t->order);
    state_free(&t->undo);
    ebb_capture_free(t->cap);
    ebb_lr_scheduler_free(t->sched);
    ebb_optimizer_free(t->opt);
    ebb_model_free(t->m);
    ebb_dataset_free(t->train);
    ebb_dataset_free(t->test);
    free(t->data);
    ckpt_info_free(&t->ci);
    ebb_plan_free(t->plan);
    ebb_plan_free(t->infer);
    ebb_spec_free(t->j.spec);
}

/* ---- the steps ---- */

/* The traced step's summary line; the file is written now, not at the end:
 * a long run's trace is there to look at while it trains. */
static int trace_done(trainer *t, double loss, const ebb_run_stats *stats) {
    const topts *o = &t->o;
    char dn[32], lb[32];
    fprintf(t->trace.f,
            "{\"summary\": {\"steps\": %lld, \"peak_bytes\": %lld, "
            "\"planned_peak_bytes\": %lld, \"peak_kind\": \"%s\", \"training_step\": %lld, "
            "\"epoch\": %lld, \"loss\": %s, \"device\": \"%s\"}}\n",
            (long long)t->trace.steps, (long long)stats->measured_peak_bytes, (long long)t->planned,
            ebb_plan_peak_is_bound_on(t->plan, t->j.dev) ? "bound" : "exact", (long long)t->step,
            (long long)((t->step - 1) / t->per_epoch + 1), fmt_loss(loss, 1, 1, lb, sizeof lb),
            ebb_device_str(t->j.dev, dn, sizeof dn));
    ebb_status st = ebb_file_commit(t->tw);
    t->tw = NULL;
    if (st != EBB_OK) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    if (o->json) return 0;
    const char *sym = NULL;
    if (t->tty) printf("\n");
    ebb_spec_input_dim(t->j.spec, 0, 0, &sym);
    printf("trace of step %lld written to %s; draw it with: ebb chart %s --train -i %s=%lld",
           (long long)t->step, o->trace, ebb_spec_file(t->j.spec), sym ? sym : "batch",
           (long long)o->batch);
    for (int i = 0; i < o->n_params; i++)
        printf(" -p %s", o->params[i]);
    if (strcmp(t->kind, "adamw")) printf(" --optimizer %s", t->kind);
    if (o->memory_budget == EBB_MEMORY_BUDGET_LEAST)
        printf(" --memory-budget least");
    else if (o->memory_budget)
        printf(" --memory-budget %lld", (long long)o->memory_budget);
    printf(" --trace %s -o chart.svg\n", o->trace);
    fflush(stdout);
    return 0;
}

static void print_start(const trainer *t) {
    const topts *o = &t->o;
    if (o->json) return;
    char sched[256] = "";
    if (t->sched) {
        memcpy(sched, ", schedule ", 12);
        ebb_lr_schedule_str(&t->sched_spec, sched + 11, sizeof sched - 11);
    }
    printf("training %s on %s: %lld samples, batch %lld, %lld steps per epoch, %s lr %g%s\n",
           ebb_spec_file(t->j.spec), o->data, (long long)t->n, (long long)o->batch,
           (long long)t->per_epoch, t->kind, ebb_optimizer_get_options(t->opt).lr, sched);
    ebb_remat_stats rs;
    char bb[32], pk[32], nb[32];
    if (o->memory_budget && ebb_plan_remat_stats(t->plan, &rs) == EBB_OK)
        printf("memory budget %s: the step's peak %s, %s keeping every activation; %d "
               "steps recomputed, %.0f%% more compute\n",
               rs.budget == EBB_MEMORY_BUDGET_LEAST ? "least"
                                                    : ebb_bytes_str(rs.budget, bb, sizeof bb),
               ebb_bytes_str(rs.peak_bytes, pk, sizeof pk),
               ebb_bytes_str(rs.no_recompute_peak_bytes, nb, sizeof nb), rs.n_recompute_steps,
               rs.flops ? 100.0 * (double)rs.recompute_flops / (double)rs.flops : 0.0);
    if (t->step > 0)
        printf("resumed from %s at step %lld%s\n", o->resume, (long long)t->step,
               t->step == t->total ? ", the run's last: nothing to train" : "");
    fflush(stdout);
}

/* After a step, its loss must be finite, and with --skip-nonfinite the
 * state it left too. The updates ran inside the backward, so the model has
 * them already: --skip-nonfinite puts back the copy taken before the step
 * and counts it; otherwise training stops, before anything is written. */
static int check_step(trainer *t, double loss, int *skipped) {
    char why[512] = "";
    *skipped = 0;
    if (!isfinite(loss)) {
        snprintf(why, sizeof why, "the loss is %s", isnan(loss) ? "NaN" : "infinite");
    } else if (t->o.skip_nonfinite) {
        state s = {0};
        ebb_status st = state_view(&s, t->m, t->opt);
        if (st == EBB_OK) st = state_check_finite(&s, t->m, 0, NULL);
        state_free(&s);
        if (st == EBB_ERR_ARG)
            snprintf(why, sizeof why, "the update left %s", ebb_errmsg());
        else if (st != EBB_OK)
            return ebb_cli_fail_status(st);
    }
    if (!why[0]) return 0;
    if (!t->o.skip_nonfinite) {
        if (t->tty) printf("\n");
        fflush(stdout);
        char last[PATH_MAX + 64] = "";
        if (t->last_ckpt > 0)
            snprintf(last, sizeof last, " (%s holds step %lld)", t->ckpt_path,
                     (long long)t->last_ckpt);
        fprintf(stderr,
                "ebb: step %lld: %s, and the step's updates are in the model: training "
                "stops, writing nothing%s; lower --lr, or --skip-nonfinite undoes such steps\n",
                (long long)t->step, why, last);
        return EXIT_SPEC;
    }
    ebb_status st = state_restore(&t->undo, t->m, t->opt);
    if (st != EBB_OK) return ebb_cli_fail_status(st);
    if (!t->skipped++) {
        t->first_skipped = t->step;
        snprintf(t->first_skip_why, sizeof t->first_skip_why, "%s", why);
    }
    *skipped = 1;
    return 0;
}

/* One training step on the next batch; *loss is NAN for a step skipped. */
static int trainer_step(trainer *t, int traced, double *loss, ebb_run_stats *stats) {
    const topts *o = &t->o;
    int64_t e = t->step / t->per_epoch, at = t->step % t->per_epoch * o->batch;
    int64_t cnt = t->n - at < o->batch ? t->n - at : o->batch;
    if (e != t->shuffled_epoch) {
        ebb_dataset_order(t->order, t->n, o->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(e + 1)),
                          !o->no_shuffle);
        t->shuffled_epoch = e;
    }
    ebb_run_options ro = {
        .seed = o->seed, .trace = traced ? ebb_cli_trace_step : NULL, .trace_user = &t->trace};
    ebb_status st = o->skip_nonfinite ? state_copy(&t->undo, t->m, t->opt) : EBB_OK;
    if (st == EBB_OK) st = make_batch(&t->j, t->train, t->order + at, cnt, t->ts);
    /* --cuda-graph: full batches replay the captured step (made at the
     * first); a graph is not measured, so such a step reports its plan */
    int graphed = o->cuda_graph && !traced && cnt == o->batch;
    if (st == EBB_OK && graphed && !t->cap)
        st = ebb_train_capture(&t->cap, t->plan, t->m, t->opt, t->ts, t->ts + t->j.n_in, o->seed);
    if (st == EBB_OK && graphed) {
        st = ebb_capture_train_step(t->cap, t->ts, t->ts + t->j.n_in, loss);
        *stats = (ebb_run_stats){.planned_peak_bytes = t->planned, .over_step = -1};
        t->graph_steps += st == EBB_OK;
    } else if (st == EBB_OK) {
        st = ebb_train_step_ex(t->plan, t->m, t->opt, t->ts, t->ts + t->j.n_in, loss, &ro, stats);
    }
    free_batch(t->ts, t->j.n_fields);
    if (st != EBB_OK) {
        /* updates run inside the backward, so a step that fails there may
         * leave some parameters updated: the model is not saved */
        int rc = ebb_cli_fail_status(ebb_spec_annotate_error(t->j.spec, st));
        if (o->checkpoint)
            fprintf(stderr, "ebb: step %lld failed and nothing was saved; %s is as the last "
                    "checkpoint left it: continue with --resume %s\n",
                    (long long)t->step + 1, o->checkpoint, o->checkpoint);
        else
            fprintf(stderr, "ebb: step %lld failed and nothing was saved\n",
                    (long long)t->step + 1);
        return rc;
    }
    t->step++;
    t->done_steps++;
    t->step_lr = ebb_optimizer_get_options(t->opt).lr;
    /* the next step's rate, as scheduler.step() after optimizer.step() */
    if (t->sched && ebb_lr_scheduler_step(t->sched) != EBB_OK) {
        fprintf(stderr, "ebb: step %lld: %s\n", (long long)t->step, ebb_errmsg());
        return EXIT_USAGE;
    }
    if (stats->measured_peak_bytes > t->measured) t->measured = stats->measured_peak_bytes;
    if (stats->over_step >= 0 || stats->measured_peak_bytes > stats->planned_peak_bytes) {
        /* the first such step is named; a summary at the end counts them */
        char when[64];
        snprintf(when, sizeof when, "at training step %lld", (long long)t->step);
        int orc = t->over_steps++ == 0 || o->strict_memory
                      ? ebb_cli_check_over(t->plan, stats, stats->measured_peak_bytes,
                                           o->strict_memory, when)
                      : 0;
        if (orc) {
            fprintf(stderr, "ebb: training stopped at step %lld and nothing was saved%s%s\n",
                    (long long)t->step, o->checkpoint ? "; the last checkpoint is in " : "",
                    o->checkpoint ? o->checkpoint : "");
            return orc;
        }
    }
    int skipped = 0, rc = check_step(t, *loss, &skipped);
    if (!rc && traced) rc = trace_done(t, *loss, stats);
    if (skipped) *loss = NAN;
    return rc;
}

/* The step's loss into the running means, the curve's point, the log line
 * and the progress line. */
static int report_step(trainer *t, double loss) {
    const topts *o = &t->o;
    int counted = !isnan(loss);
    int64_t e = (t->step - 1) / t->per_epoch;
    t->run_loss += counted ? loss : 0;
    t->epoch_loss += counted ? loss : 0;
    t->curve_loss += counted ? loss : 0;
    t->run_n += counted;
    t->epoch_n += counted;
    t->curve_n += counted;
    t->epoch_steps++;
    t->epoch_skipped += !counted;
    if (t->curve && (t->step % t->window == 0 || t->step == t->total || stop_signal)) {
        ebb_status st = ebb_cli_curve_step(
            t->curve, t->step, samples_at(t->step, t->per_epoch, t->epoch_samples, o->batch),
            t->curve_n ? t->curve_loss / (double)t->curve_n : NAN);
        t->curve_loss = 0;
        t->curve_n = 0;
        if (st != EBB_OK) return ebb_cli_fail_status(st);
    }
    double now = now_s(),
           rate = (double)(t->done_steps * o->batch) / (now - t->t0 > 1e-9 ? now - t->t0 : 1e-9);
    char lb[32], eta[32], mb[32], pb[32];
    if (o->log_every && t->step % o->log_every == 0) {
        if (o->json)
            printf("{\"type\": \"step\", \"epoch\": %lld, \"step\": %lld, \"steps\": %lld, "
                   "\"loss\": %s, \"lr\": %.9g, \"samples_per_s\": %.1f}\n",
                   (long long)e + 1, (long long)t->step, (long long)t->total,
                   fmt_loss(t->run_loss, t->run_n, 1, lb, sizeof lb), t->step_lr, rate);
        else if (!t->tty && t->sched)
            printf("epoch %lld step %lld/%lld loss %s lr %.6g %.0f samples/s\n",
                   (long long)e + 1, (long long)t->step, (long long)t->total,
                   fmt_loss(t->run_loss, t->run_n, 0, lb, sizeof lb), t->step_lr, rate);
        else if (!t->tty)
            printf("epoch %lld step %lld/%lld loss %s %.0f samples/s\n", (long long)e + 1,
                   (long long)t->step, (long long)t->total,
                   fmt_loss(t->run_loss, t->run_n, 0, lb, sizeof lb), rate);
        t->run_loss = 0;
        t->run_n = 0;
        fflush(stdout); /* a log read as it is written (a pipe, tail -f) */
    }
    if (t->tty && (now - t->last_draw > 0.2 || t->step == t->total)) {
        fmt_eta((double)(t->total - t->step) * (double)o->batch / rate, eta, sizeof eta);
        printf("\repoch %lld/%lld step %lld/%lld %.0f samples/s loss %s ETA %s peak %s/%s "
               "planned\033[K",
               (long long)e + 1, (long long)t->epochs, (long long)t->step, (long long)t->total,
               rate, fmt_loss(t->epoch_loss, t->epoch_n, 0, lb, sizeof lb), eta,
               ebb_bytes_str(t->measured, mb, sizeof mb), ebb_bytes_str(t->planned, pb, sizeof pb));
        fflush(stdout);
        t->last_draw = now;
    }
    return 0;
}

/* An epoch's end: the evaluation, its line and the learning curves. */
static int epoch_end(trainer *t) {
    const topts *o = &t->o;
    int64_t e = (t->step - 1) / t->per_epoch;
    double el = 0, acc = 0, secs = now_s() - t->t_epoch;
    ebb_status st;
    if (t->test && (st = evaluate(&t->j, t->infer, t->m, t->test, o->batch, &el, &acc)) != EBB_OK) {
        if (t->tty) printf("\n");
        return ebb_cli_fail_status(st);
    }
    char lb[32], skips[64] = "";
    long long n_test = (long long)ebb_dataset_size(t->test);
    if (o->json) {
        printf("{\"type\": \"epoch\", \"epoch\": %lld, \"step\": %lld, \"loss\": %s, "
               "\"seconds\": %.3f",
               (long long)e + 1, (long long)t->step,
               fmt_loss(t->epoch_loss, t->epoch_n, 1, lb, sizeof lb), secs);
        if (o->skip_nonfinite) printf(", \"skipped\": %lld", (long long)t->epoch_skipped);
        if (t->test)
            printf(", \"eval_loss\": %s, \"eval_samples\": %lld", fmt_loss(el, 1, 1, lb, sizeof lb),
                   n_test);
        if (t->test && t->j.classify) printf(", \"eval_accuracy\": %.9g", acc);
        printf("}\n");
    } else {
        if (t->tty) printf("\n");
        if (t->epoch_skipped)
            snprintf(skips, sizeof skips, ", %lld skipped", (long long)t->epoch_skipped);
        printf("epoch %lld: loss %s (%lld steps%s, %.1f s, %.0f samples/s)\n", (long long)e + 1,
               fmt_loss(t->epoch_loss, t->epoch_n, 0, lb, sizeof lb), (long long)t->epoch_steps,
               skips, secs, (double)(t->epoch_steps * o->batch) / (secs > 1e-9 ? secs : 1e-9));
        if (t->test && t->j.classify)
            printf("eval: accuracy %.4f loss %.4f on %lld samples\n", acc, el, n_test);
        else if (t->test)
            printf("eval: loss %.4f on %lld samples\n", el, n_test);
    }
    fflush(stdout);
    /* the picture after every epoch: a run stopped later still has it */
    if (t->curve &&
        ((st = ebb_cli_curve_epoch(
              t->curve, e + 1, samples_at(t->step, t->per_epoch, t->epoch_samples, o->batch),
              t->epoch_n ? t->epoch_loss / (double)t->epoch_n : NAN, t->test ? el : NAN,
              t->test && t->j.classify ? acc : NAN)) != EBB_OK ||
         (st = ebb_cli_curve_save(t->curve, o->curve, "--curve")) != EBB_OK)) {
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
        return EXIT_RUNTIME;
    }
    t->epoch_loss = 0;
    t->epoch_n = t->epoch_steps = t->epoch_skipped = 0;
    t->t_epoch = now_s();
    return 0;
}

/* Refuses to write a model (params_only) or a checkpoint holding NaN or
 * Inf: the file at `path` keeps what it had. */
static int refuse_nonfinite(const trainer *t, const state *s, int params_only, const char *who,
                            const char *path) {
    ebb_status st = state_check_finite(s, t->m, params_only, NULL);
    if (st == EBB_ERR_ARG) {
        fprintf(stderr, "ebb: %s %s not written after step %lld: %s; it is left as it was\n", who,
                path, (long long)t->step, ebb_errmsg());
        return EXIT_SPEC;
    }
    return st == EBB_OK ? 0 : ebb_cli_fail_status(st);
}

/* Weights, optimizer state (optim.* as ebb_optimizer_save() names it) and
 * __metadata__, in one atomic safetensors file, never one holding NaN or
 * Inf. */
static int checkpoint(trainer *t) {
    const topts *o = &t->o;
    state s = {0};
    char *stateless = stateless_params(t->plan, t->m, t->opt);
    ebb_status st =
        stateless ? state_view(&s, t->m, t->opt) : ebb_error_set(EBB_ERR_NOMEM, "out of memory");
    int rc = st == EBB_OK ? refuse_nonfinite(t, &s, 0, "--checkpoint", t->ckpt_path)
                          : ebb_cli_fail_status(st);
    if (!rc) {
        char s_step[32], s_epoch[32], s_seed[32], s_batch[32];
        snprintf(s_step, sizeof s_step, "%lld", (long long)t->step);
        snprintf(s_epoch, sizeof s_epoch, "%lld", (long long)(t->step / t->per_epoch));
        snprintf(s_seed, sizeof s_seed, "%llu", (unsigned long long)o->seed);
        snprintf(s_batch, sizeof s_batch, "%lld", (long long)o->batch);
        char s_sched[256] = "", s_ssteps[32], s_slr[32], s_sbase[32];
        if (t->sched) {
            ebb_lr_schedule_str(&t->sched_spec, s_sched, sizeof s_sched);
            snprintf(s_ssteps, sizeof s_ssteps, "%lld", (long long)ebb_lr_scheduler_steps(t->sched));
            snprintf(s_slr, sizeof s_slr, "%.17g", ebb_lr_scheduler_lr(t->sched));
            snprintf(s_sbase, sizeof s_sbase, "%.17g", ebb_lr_scheduler_base_lr(t->sched));
        }
        const char *meta[] = {"ebb_checkpoint", "1",
                              "step",           s_step,
                              "epoch",          s_epoch,
                              "seed",           s_seed,
                              "batch",          s_batch,
                              "shuffle",        o->no_shuffle ? "0" : "1",
                              "drop_last",      o->drop_last ? "1" : "0",
                              "data",           t->data,
                              "stateless",      stateless,
                              /* last, left out without a schedule */
                              "lr_schedule",      s_sched,
                              "lr_schedule_steps", s_ssteps,
                              "lr_schedule_lr",   s_slr,
                              "lr_schedule_base", s_sbase};
        ebb_optimizer_options oo = ebb_optimizer_get_options(t->opt);
        st = state_write(&s, t->m, &oo, t->ckpt_path, 1, meta,
                         (int)(sizeof meta / sizeof meta[0] / 2) - (t->sched ? 0 : 4));
        if (st != EBB_OK) {
            fprintf(stderr, "ebb: %s\n", ebb_errmsg());
            rc = EXIT_RUNTIME;
        }
    }
    state_free(&s);
    free(stateless);
    if (!rc) t->last_ckpt = t->step;
    return rc;
}

static void report_skips(const trainer *t) {
    if (t->skipped)
        fprintf(stderr,
                "ebb: --skip-nonfinite: skipped %lld of %lld steps (the first, step %lld: "
                "%s)\n",
                (long long)t->skipped, (long long)t->done_steps, (long long)t->first_skipped,
                t->first_skip_why);
}

/* A signal asked to stop: the checkpoint is written; what else is said. */
static int stopped(trainer *t) {
    if (t->tty) printf("\n");
    fflush(stdout);
    if (t->curve && ebb_cli_curve_save(t->curve, t->o.curve, "--curve") != EBB_OK)
        fprintf(stderr, "ebb: %s\n", ebb_errmsg());
    if (t->tw)
        fprintf(stderr, "ebb: --trace: step %lld was not reached; %s is left as it was\n",
                (long long)t->trace_at, t->o.trace);
    report_skips(t);
    fprintf(stderr,
            "ebb: interrupted by %s after step %lld; checkpoint written to %s (resume "
            "with --resume %s)\n",
            signal_name(stop_signal), (long long)t->step, t->ckpt_path, t->ckpt_path);
    return EXIT_SIGNAL_BASE + stop_signal;
}

/* The run's end: the last checkpoint and the weights. */
static int finish(trainer *t) {
    const topts *o = &t->o;
    int rc = 0;
    if (o->checkpoint_every && t->last_ckpt != t->step && (rc = checkpoint(t))) return rc;
    if (o->save_weights) {
        state s = {0};
        ebb_status st = state_view(&s, t->m, t->opt);
        rc = st == EBB_OK ? refuse_nonfinite(t, &s, 1, "--save-weights", o->save_weights)
                          : ebb_cli_fail_status(st);
        state_free(&s);
        if (rc) return rc;
        if (ebb_model_save(t->m, o->save_weights) != EBB_OK) {
            fprintf(stderr, "ebb: %s\n", ebb_errmsg());
            return EXIT_RUNTIME;
        }
        if (!o->json) printf("weights written to %s\n", o->save_weights);
    }
    if (t->curve && !o->json) printf("learning curves drawn in %s\n", o->curve);
    if (o->cuda_graph && !o->json)
        printf("%lld of %lld steps replayed from a CUDA graph\n", (long long)t->graph_steps,
               (long long)t->done_steps);
    report_skips(t);
    if (t->over_steps > 1)
        fprintf(stderr, "ebb: warning: %lld of %lld training steps measured more than their "
                        "plan\n",
                (long long)t->over_steps, (long long)t->done_steps);
    return 0;
}

static int trainer_run(trainer *t) {
    const topts *o = &t->o;
    int rc = 0;
    print_start(t);
    signals_install();
    t->t0 = t->t_epoch = now_s();
    while (!rc && t->step < t->total) {
        double loss = 0;
        ebb_run_stats stats = {0};
        if ((rc = trainer_step(t, t->tw && t->step + 1 == t->trace_at, &loss, &stats)) ||
            (rc = report_step(t, loss)))
            break;
        if (t->step % t->per_epoch == 0 || t->step == t->total) rc = epoch_end(t);
        if (!rc && ((o->checkpoint_every && t->step % o->checkpoint_every == 0) || stop_signal))
            rc = checkpoint(t);
        if (!rc && stop_signal) rc = stopped(t);
    }
    return rc ? rc : finish(t);
}

int ebb_cli_train(int argc, char **argv) {
    trainer t;
    memset(&t, 0, sizeof t);
    int rc = trainer_open(&t, argc, argv);
    if (!rc) rc = trainer_run(&t);
    trainer_close(&t);
    return rc < 0 ? 0 : rc;
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
    if ((rc = load_job(&j, &o)) || (rc = compile_plan(&j, o.batch, NULL, 0, NULL, &plan)) ||
        (rc = open_data(&j, &o, o.data, plan, &d)))
        goto done;
    if ((st = ebb_model_new(&m, plan, j.dev, 0)) != EBB_OK) {
        rc = ebb_cli_fail_status(st);
        goto done;
    }
    if ((rc = load_weights(m, o.weights, o.allow_nonfinite))) goto done;
    double loss = 0, acc = 0;
    if ((st = evaluate(&j, plan, m, d, o.batch, &loss, &acc)) != EBB_OK) {
        rc = ebb_cli_fail_status(ebb_spec_annotate_error(j.spec, st));
        goto done;
    }
    long long n = (long long)ebb_dataset_size(d);
    char lb[32];
    if (o.json) {
        printf("{\"samples\": %lld, \"loss\": %s", n, fmt_loss(loss, 1, 1, lb, sizeof lb));
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
